"""Observability as code: the Grafana dashboards (`dashboards`, `generate`) and the cardinality budget (`budget`)."""
