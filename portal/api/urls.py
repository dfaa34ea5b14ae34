from django.urls import path, re_path
from rest_framework.routers import DefaultRouter

from portal.reports.api import OverviewReportView, UsageReportView

from . import audit_views, fleet_views, organisation_views, team_admin_views, team_settings_views, views
from .workloads import WorkloadListView

router = DefaultRouter()
router.register("reservations", views.ReservationViewSet, basename="reservation")
router.register("teams", views.TeamViewSet, basename="team")
router.register("departments", organisation_views.DepartmentViewSet, basename="department")
router.register("memberships", team_admin_views.MembershipViewSet, basename="membership")
router.register("exclusion-groups", team_admin_views.ExclusionGroupViewSet, basename="exclusion-group")
router.register("affinity-labels", team_admin_views.AffinityLabelViewSet, basename="affinity-label")
router.register("presets", team_admin_views.PresetViewSet, basename="preset")
router.register("audit", audit_views.AuditViewSet, basename="audit")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("tokens", views.TokenViewSet, basename="token")

urlpatterns = [
    path("auth/token/", views.ObtainTokenView.as_view(), name="obtain-token"),
    path("workloads/", WorkloadListView.as_view(), name="api-workloads"),
    path("capacity/", views.CapacityView.as_view(), name="capacity"),
    path("bookings/", views.BookingsView.as_view(), name="bookings"),
    path("reports/usage/", UsageReportView.as_view(), name="usage-report"),
    path("reports/overview/", OverviewReportView.as_view(), name="overview-report"),
    path("teams/<slug:slug>/policy/", team_settings_views.TeamPolicyView.as_view(), name="api-team-policy"),
    path("teams/<slug:slug>/limits/", team_settings_views.TeamLimitsView.as_view(), name="api-team-limits"),
    path("teams/<slug:slug>/usage/", team_settings_views.TeamUsageView.as_view(), name="api-team-usage"),
    path("teams/<slug:slug>/quotas/", organisation_views.TeamQuotasView.as_view(), name="api-team-quotas"),
    path("departments/<slug:slug>/quotas/", organisation_views.DepartmentQuotasView.as_view(),
         name="api-department-quotas"),
    re_path(r"^nodes/(?P<name>[-a-zA-Z0-9_.]{1,253})/token/$", fleet_views.NodeTokenView.as_view(),
            name="api-node-token"),
    re_path(r"^nodes/(?P<name>[-a-zA-Z0-9_.]{1,253})/drains/$", fleet_views.NodeDrainsView.as_view(),
            name="api-node-drains"),
    re_path(r"^nodes/(?P<name>[-a-zA-Z0-9_.]{1,253})/drains/(?P<pk>[0-9]{1,12})/$", fleet_views.NodeDrainView.as_view(),
            name="api-node-drain"),
    re_path(r"^gpus/(?P<uuid>[-a-zA-Z0-9_.]{1,96})/cordon/$", fleet_views.GpuCordonView.as_view(),
            name="api-gpu-cordon"),
    *router.urls,
]
