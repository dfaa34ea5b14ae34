"""Who moves a reservation when no person does: the names its audit rows carry for each part of
the system."""

SCHEDULER = "system:scheduler"  # the placement cycle: places, warns and reclaims
PLACEMENT = "system:placement"  # binding pods and recording what the cluster made of them
LIFECYCLE = "system:lifecycle"  # ends and moves: expiry, idle reclaim, lost nodes, cluster events
RECONCILE = "system:reconcile"  # the periodic comparison of the database with the cluster
DEMO_HISTORY = "system:demo-history"  # the demo's week of past reservations (web/demo_history.py)
