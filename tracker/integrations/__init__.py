"""Adapters to training frameworks.

Each module here imports only :mod:`tracker` and its framework, which is an
optional extra (``pip install 'tracker[ultralytics]'``); importing
:mod:`tracker.integrations` itself imports nothing heavy.
"""
