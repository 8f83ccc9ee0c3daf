"""Shipped configs (YAML/JSON data, no code): `importlib.resources.files("geopilot.configs")`."""
