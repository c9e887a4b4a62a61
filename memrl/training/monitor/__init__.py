"""What a run reports and how it reacts: metrics, trackers, the trajectory dump, health alarms, the guard."""
