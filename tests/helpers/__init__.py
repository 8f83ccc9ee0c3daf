"""Shared test helpers: fixtures in real on-disk formats, scripted sessions, servers. Imported as `helpers.*`
(tests/ is on pytest's pythonpath); no name here shadows a source package."""
