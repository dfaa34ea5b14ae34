"""The refusal every service that checks input raises: per-field messages saying what is wrong and
what to do, {"gpu_limit": ["must be ≥ gpu_request (0.5)"]}. Pages show them on their fields, the
API answers 400 (api/exceptions.py). It sits below every app, so tenancy, reservations and the
pages all raise and catch the one class."""


class RuleViolation(Exception):
    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors
