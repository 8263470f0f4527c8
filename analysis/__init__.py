"""Analysis scripts and helpers for scape run files and gradient traces."""
