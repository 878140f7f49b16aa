"""Each live run's health as Prometheus metrics (prometheus-client), read from the store at every scrape.

For labs that alert from Grafana or Alertmanager: `observatory metrics --port 9108` serves `/metrics` with,
per run (labels `run`, `project`) that is running, or crashed within `alert_horizon_s`:
`observatory_run_step`, `observatory_run_loss`, `observatory_run_mfu`, `observatory_run_seconds_since_progress`,
`observatory_run_up` (1 running, 0 crashed), and `observatory_run_open_alerts` (label `severity`).
"""

from __future__ import annotations

import time
from collections import Counter
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily

from observatory.alerts import open_alerts
from observatory.alerts.conditions import live_runs
from observatory.events import SEVERITIES
from observatory.queries.alerts import last_values
from observatory.store import using

__all__ = ["RunHealth", "serve", "LOSS_NAMES", "MFU_NAMES"]

LOSS_NAMES = ("train/loss", "loss", "train_loss", "train/ce_loss")  # the first a run has is its loss
MFU_NAMES = ("throughput/mfu", "mfu", "train/mfu")


class RunHealth:
    """A prometheus-client collector: one store read per scrape."""

    def __init__(self, db):
        self.db = db

    def collect(self):
        now = time.time()
        labels = ["run", "project"]
        fams = {
            "step": GaugeMetricFamily("observatory_run_step", "newest step of the run", labels=labels),
            "loss": GaugeMetricFamily("observatory_run_loss", "newest training loss", labels=labels),
            "mfu": GaugeMetricFamily("observatory_run_mfu", "newest model FLOPs utilisation", labels=labels),
            "since": GaugeMetricFamily(
                "observatory_run_seconds_since_progress",
                "seconds since the newest logged step",
                labels=labels,
            ),
            "up": GaugeMetricFamily("observatory_run_up", "1 while running, 0 once crashed", labels=labels),
        }
        alerts_fam = GaugeMetricFamily(
            "observatory_run_open_alerts", "alerts open now", labels=[*labels, "severity"]
        )
        with using(self.db) as con:
            runs = live_runs(con, now)
            names = list(dict.fromkeys(LOSS_NAMES + MFU_NAMES))
            series = last_values(con, sorted(runs), names)
            opened = open_alerts(con, runs)
        per_run: Counter = Counter(
            (k[0], d.get("severity")) for k, d in opened.items()
        )  # one pass, not per run
        last: dict[str, dict[str, tuple[float, float]]] = {}
        for run, name, value, t in series:
            last.setdefault(run, {})[name] = (value, t)
        for run, r in sorted(runs.items()):
            lv = [run, r.project or ""]
            mine = last.get(run, {})
            if r.last_step is not None:
                fams["step"].add_metric(lv, r.last_step)
            for key, names_ in (("loss", LOSS_NAMES), ("mfu", MFU_NAMES)):
                hit = next((mine[n] for n in names_ if n in mine), None)
                if hit is not None:
                    fams[key].add_metric(lv, hit[0])
            progress = max((t for _, t in mine.values() if t is not None), default=None) or r.start_time
            if progress is not None:
                fams["since"].add_metric(lv, max(0.0, now - progress))
            fams["up"].add_metric(lv, 1.0 if r.status == "running" else 0.0)
            for sev in SEVERITIES:
                alerts_fam.add_metric([*lv, sev], per_run[run, sev])
        yield from fams.values()
        yield alerts_fam


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # one line per scrape is noise
        pass


def serve(db, host: str = "127.0.0.1", port: int = 9108) -> WSGIServer:
    """A WSGI server (not yet serving: call `serve_forever`) of /metrics for the store `db`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunHealth(db))
    return make_server(host, port, make_wsgi_app(registry), handler_class=_Quiet)
