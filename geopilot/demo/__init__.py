"""`geopilot demo`: the whole GeoPilot recipe end to end on one CPU machine, with a report (docs/demo.md)."""
