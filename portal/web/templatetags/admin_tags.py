"""Helpers of the admin pages."""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()

_TICKS = re.compile(r"`([^`<>&]{1,80})`")


@register.filter
def ticks(text: str) -> str:
    """Plain text whose `names` (group labels in the services' sentences) become <code>."""
    return mark_safe(_TICKS.sub(r"<code>\1</code>", str(escape(text))))  # noqa: S308 (escaped first)
