"""geopilot.data_gen"""
