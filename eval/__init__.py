"""geopilot.eval"""
