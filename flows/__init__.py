"""Prefect flows: only wiring. ``pipeline`` runs every stage; one flow per stage reruns it alone."""
