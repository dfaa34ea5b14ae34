"""Domain exceptions → HTTP answers with messages that say what is wrong."""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import status
from rest_framework.fields import DateTimeField
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.errors import RuleViolation
from portal.reservations.drain_effects import DrainBreaksBookings
from portal.reservations.engine_quotas import NeverFits
from portal.reservations.services.booking import BookingConflict
from portal.reservations.states import IllegalTransition
from portal.security import unavailable


def exception_handler(exc, context):
    if isinstance(exc, RuleViolation):
        return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, NeverFits):  # the only refusal for quota: beyond a hard limit, it could never run
        return Response({"detail": str(exc), "code": "never_fits", "team": exc.team.slug},
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, BookingConflict):
        at = DateTimeField().to_representation
        windows = [{"starts_at": at(start), "ends_at": at(end)} for start, end in exc.free_windows]
        return Response({"detail": str(exc), "code": "booking_conflict", "free_windows": windows},
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DrainBreaksBookings):
        at = DateTimeField().to_representation
        bookings = [{"id": r.pk, "team": r.team.slug, "owner": r.owner.get_username(), "starts_at": at(r.starts_at),
                     "ends_at": at(r.ends_at)} for r in exc.bookings]
        return Response({"detail": str(exc), "code": "drain_breaks_bookings", "bookings": bookings},
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, IllegalTransition):
        return Response(
            {"detail": f"not allowed: the reservation is {exc.current}", "code": "illegal_transition",
             "state": exc.current},
            status=status.HTTP_409_CONFLICT,
        )
    if unavailable.is_database_unavailable(exc):
        return unavailable.response(context["request"], exc)
    if isinstance(exc, ObjectDoesNotExist):
        return Response({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    return drf_exception_handler(exc, context)
