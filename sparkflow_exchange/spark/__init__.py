"""The Spark glue: ``format("pipelined")`` (batch and streaming), its tasks, and Spark session settings.

Everything here may import pyspark; the rest of the package does not need it. Empty on purpose: Spark
imports ``pyspark_pipelined`` (hence this package) in every short-lived planning worker.
"""
