"""Installing sparkflow-exchange is all it takes: Spark finds ``format("pipelined")`` here."""
from sparkflow_exchange.spark.datasource import PipelinedDataSource as DefaultSource

__all__ = ["DefaultSource"]
