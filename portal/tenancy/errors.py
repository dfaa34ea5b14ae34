"""The refusal every tenancy operation raises: per-field messages saying what to do, like
portal.reservations.rules.RuleViolation. Pages show them on their fields, the API answers 400."""


class Refused(Exception):
    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors
