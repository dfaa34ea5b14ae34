from django.urls import path
from rest_framework.routers import DefaultRouter

from portal.reports.api import OverviewReportView, UsageReportView

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
    path("reports/usage/", UsageReportView.as_view(), name="usage-report"),
    path("reports/overview/", OverviewReportView.as_view(), name="overview-report"),
    *router.urls,
]
