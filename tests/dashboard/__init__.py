"""Tests of the dashboard: kvlab.dashboard, pages/ and app.py."""
