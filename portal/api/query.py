"""Refuse query parameters a view does not understand: a typo such as `?stat=pending` must not
silently return everything."""

from __future__ import annotations

import django_filters
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend

PAGINATION = {"page", "page_size"}
ALWAYS = {"format"}


def refuse_unknown(params, allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed - ALWAYS)
    if unknown:
        raise ValidationError({name: [f"unknown query parameter; allowed: {', '.join(sorted(allowed)) or 'none'}"]
                               for name in unknown})


class StrictQueryParams(BaseFilterBackend):
    def filter_queryset(self, request, queryset, view):
        allowed = set()
        typed = set()  # filters whose empty value means nothing (django-filter would ignore it)
        filterset_class = DjangoFilterBackend().get_filterset_class(view, queryset)
        if filterset_class is not None:
            allowed |= set(filterset_class.base_filters)
            typed |= {name for name, f in filterset_class.base_filters.items()
                      if isinstance(f, django_filters.ChoiceFilter | django_filters.MultipleChoiceFilter
                                    | django_filters.NumberFilter)}
        if getattr(view, "action", None) == "list" and getattr(view, "pagination_class", None):
            allowed |= PAGINATION
        refuse_unknown(request.query_params, allowed)
        refuse_empty(request.query_params, typed)
        return queryset


def refuse_empty(params, names: set[str]) -> None:
    """Numbers given as `?x=` are mistakes, not "use the default"."""
    empty = sorted(n for n in names if n in params and any(v == "" for v in params.getlist(n)))
    if empty:
        raise ValidationError({n: ["must not be empty"] for n in empty})
