"""Fault-injection scenarios ("chaos"): kill workers, model hosts and Redis mid-work; nothing accepted is lost."""
