"""Data shipped with the package (COCO train2017 per-class instance counts)."""
