"""The harness that runs a dispatch case: what to run (spec.py, sweep.py), before anything starts
(preflight.py), rank processes (launch.py), checking and timing each backend (runner.py,
timing.py, views.py, overlap.py). A backend is one file in backends/; the harness does the rest."""
