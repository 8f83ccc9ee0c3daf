"""geopilot.tools"""
