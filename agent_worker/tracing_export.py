"""Where lap spans go (``AGENT_WORKER_TRACE_EXPORT``): OTLP, the optional
extra ``agent-worker[otlp]``, exported in a background batch; or ``file:PATH``,
JSON lines written as each span ends (tests, debugging: a SIGKILLed lap's
ended children are already on disk)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from agent_worker.core.errors import ConfigurationError


class JsonLinesExporter(SpanExporter):
    """Spans as JSON lines appended to a file (tests, debugging): one
    ``write`` per span on an ``O_APPEND`` file, so the processes of a fleet
    can share one file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            for span in spans:
                os.write(fd, (span.to_json(indent=None) + "\n").encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def span_processor(export: str) -> SimpleSpanProcessor | BatchSpanProcessor:
    """The processor for ``export``, or ``ConfigurationError`` (an unknown
    value, or ``otlp`` without its extra installed)."""
    if export.startswith("file:"):
        return SimpleSpanProcessor(JsonLinesExporter(export[len("file:"):]))
    if export == "otlp":
        try:
            # Here, not at the top: the OTLP exporter is the optional [otlp] extra.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
        except ImportError as e:
            raise ConfigurationError(
                "AGENT_WORKER_TRACE_EXPORT=otlp needs the OTLP exporter: "
                "pip install 'agent-worker[otlp]'") from e
        # Endpoint, headers and timeout from the standard OTEL_EXPORTER_OTLP_* variables.
        return BatchSpanProcessor(OTLPSpanExporter())
    raise ConfigurationError(
        f"AGENT_WORKER_TRACE_EXPORT must be empty, 'otlp' or 'file:PATH', not {export!r}")


__all__ = ["JsonLinesExporter", "span_processor"]
