from django.urls import path
from rest_framework.routers import DefaultRouter

from portal.reports.api import UtilizationReportView

from . import views

router = DefaultRouter()
router.register("reservations", views.ReservationViewSet, basename="reservation")
router.register("teams", views.TeamViewSet, basename="team")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("exclusion-groups", views.ExclusionGroupViewSet, basename="exclusion-group")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("tokens", views.TokenViewSet, basename="token")

urlpatterns = [
    path("auth/token/", views.ObtainTokenView.as_view(), name="obtain-token"),
    path("capacity/", views.CapacityView.as_view(), name="capacity"),
    path("reports/utilization/", UtilizationReportView.as_view(), name="utilization-report"),
    *router.urls,
]
