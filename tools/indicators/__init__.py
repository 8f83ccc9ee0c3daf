"""A second domain on the same harness: environmental indicator rasters (COGs) analysed per administrative area."""
