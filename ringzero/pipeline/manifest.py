"""The run manifest: which stages ran with which inputs and outputs, their identities and gate results,
and, once the run ends, its targets (``targets``: name, expr, left, right, status met / missed / missing).

Written to the store (``runs/<name>/manifest.json``, committed atomically) after every stage, and
mirrored into the local run folder for people and the report.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from ringzero.config.loader import config_hash
from ringzero.config.run import RunConfig
from ringzero.pipeline.execute import ExecutedStage

MANIFEST_VERSION = 1


class RunManifest:
    def __init__(self, cfg: RunConfig, store, run_dir: Path, local: bool = True):
        self.store = store
        self.key = f"runs/{cfg.run.name}/manifest.json"
        self.local = Path(run_dir) / "manifest.json"
        self.write_local = local  # one process of a job writes the run folder's copy
        self.doc = {
            "version": MANIFEST_VERSION,
            "run": cfg.run.name,
            "config_hash": config_hash(cfg),
            "status": "running",
            "started": time.time(),
            "finished": None,
            "stages": [],
        }

    def record(self, ex: ExecutedStage) -> None:
        self.doc["stages"] = [s for s in self.doc["stages"] if s["name"] != ex.name]
        self.doc["stages"].append(
            {
                "name": ex.name,
                "kind": ex.kind,
                "stage_hash": ex.stage_hash,
                "skipped": ex.skipped,
                "inputs": asdict(ex.inputs),
                "output_uri": ex.outcome.output_uri,
                "stop_reason": ex.outcome.stop_reason,
                "steps": ex.outcome.steps,
                "wall_s": ex.outcome.wall_s,
                "summary": ex.outcome.summary,
                "gate": ex.gate.to_dict(),
            }
        )
        self._write()

    def record_targets(self, results) -> None:
        self.doc["targets"] = [r.to_dict() for r in results]
        self._write()

    def finish(self, status: str) -> None:
        self.doc["status"] = status
        self.doc["finished"] = time.time()
        self._write()

    def _write(self) -> None:
        self.store.put_json(self.key, self.doc)
        if not self.write_local:
            return
        self.local.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.local.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2, sort_keys=True))
        tmp.replace(self.local)
