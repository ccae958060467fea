"""The quota service: the long-running quota scheduler, its clock and its backends."""
