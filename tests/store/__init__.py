"""Tests of kvlab.store: the experiment store on SQLite and PostgreSQL, a tune's side of it included."""
