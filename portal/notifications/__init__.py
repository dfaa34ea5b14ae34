"""Notifications: a reservation's owner is told what happens to it (running, waiting long, expiring,
idle, reclaimed, node lost, finished, failed) in the portal, by e-mail and by webhook, as they chose."""
