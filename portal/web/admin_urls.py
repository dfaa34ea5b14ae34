"""Pages of team admins (/team/), site admins (/fleet/) and the audit log (/audit/)."""

from django.urls import path

from . import (
    audit,
    departments,
    fleet_actions,
    fleet_nodes,
    fleet_teams,
    quota_editor,
    team_admin,
    team_groups,
    team_members,
    team_policy,
    team_presets,
    team_quota,
)

urlpatterns = [
    path("team/", team_admin.team_home, name="team-admin"),
    path("team/<slug:slug>/members/", team_members.members_page, name="team-members"),
    path("team/<slug:slug>/members/<int:pk>/role/", team_members.member_role, name="team-member-role"),
    path("team/<slug:slug>/members/<int:pk>/defaults/", team_members.member_defaults, name="team-member-defaults"),
    path("team/<slug:slug>/members/<int:pk>/remove/", team_members.member_remove, name="team-member-remove"),
    path("team/<slug:slug>/groups/", team_groups.groups_page, name="team-groups"),
    path("team/<slug:slug>/groups/preview/", team_groups.group_preview, name="team-group-preview"),
    path("team/<slug:slug>/groups/<str:kind>/<int:pk>/rename/", team_groups.group_rename, name="team-group-rename"),
    path("team/<slug:slug>/groups/<str:kind>/<int:pk>/delete/", team_groups.group_delete, name="team-group-delete"),
    path("team/<slug:slug>/presets/", team_presets.presets_page, name="team-presets"),
    path("team/<slug:slug>/presets/<int:pk>/delete/", team_presets.preset_delete, name="team-preset-delete"),
    path("team/<slug:slug>/policy/", team_policy.policy_page, name="team-policy"),
    path("team/<slug:slug>/quota/", team_quota.quota_page, name="team-quota"),
    path("fleet/", fleet_nodes.fleet_page, name="fleet"),
    path("fleet/nodes/<str:name>/drain/", fleet_actions.node_drain, name="fleet-node-drain"),
    path("fleet/nodes/<str:name>/undrain/", fleet_actions.node_undrain, name="fleet-node-undrain"),
    path("fleet/nodes/<str:name>/token/", fleet_actions.node_token, name="fleet-node-token"),
    path("fleet/gpus/<int:pk>/cordon/", fleet_actions.gpu_cordon, name="fleet-gpu-cordon"),
    path("fleet/rows/", fleet_nodes.fleet_rows_page, name="fleet-rows"),
    path("fleet/teams/", fleet_teams.teams_page, name="fleet-teams"),
    path("fleet/teams/<slug:slug>/", fleet_teams.team_limits_page, name="fleet-team"),
    path("fleet/teams/<slug:slug>/quotas/", quota_editor.team_quotas_page, name="fleet-team-quotas"),
    path("fleet/departments/", departments.departments_page, name="fleet-departments"),
    path("fleet/departments/<slug:slug>/quotas/", quota_editor.department_quotas_page,
         name="fleet-department-quotas"),
    path("audit/", audit.audit_page, name="audit"),
]
