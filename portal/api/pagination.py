import re

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination

# ASCII digits only: str.isdigit() also takes '²' or '١', which int() refuses or reads; and a
# bounded length, since int() refuses strings of thousands of digits.
_WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")


def _whole_number(raw: list[str]) -> int | None:
    if len(raw) != 1 or not _WHOLE_NUMBER.fullmatch(raw[0]):
        return None
    return int(raw[0])


class StandardPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        # DRF silently falls back to the default on a bad page_size; say what is wrong instead.
        raw = request.query_params.getlist(self.page_size_query_param)
        if not raw:
            return self.page_size
        size = _whole_number(raw)
        if size is None or not (1 <= size <= self.max_page_size):
            raise ValidationError({"page_size": [f"must be one whole number from 1 to {self.max_page_size}"]})
        return size

    def paginate_queryset(self, queryset, request, view=None):
        raw = request.query_params.getlist(self.page_query_param)
        if raw and (_whole_number(raw) or 0) < 1:
            raise ValidationError({"page": ["must be one whole number, 1 or more"]})
        return super().paginate_queryset(queryset, request, view)

    def get_schema_operation_parameters(self, view):
        params = super().get_schema_operation_parameters(view)
        for p in params:
            if p["name"] == self.page_size_query_param:
                p["schema"].update({"minimum": 1, "maximum": self.max_page_size})
            if p["name"] == self.page_query_param:
                p["schema"].update({"minimum": 1, "maximum": 999_999_999})  # _WHOLE_NUMBER's nine digits
        return params
