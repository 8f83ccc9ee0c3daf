"""Planning scores (TSA / PA / NTA / OPA) of the weights being trained (`eval.planning_cases`), through
`geopilot eval planning`'s own pieces: the planning fixture tool layer, `GeoPilotAgent` over a `GeoPilot` that wraps the in-training model, the
scorer, and `summarise`. The (seed, case) pairs are split across processes and the scored rows gathered, so the
numbers equal `geopilot eval planning --agent geopilot --model <that step's export> --cases FILE --seeds ...`.
The training recipe takes it as `planning_probe` from its entry point (`geopilot train`, train.py), so
geopilot.training never imports evaluation.
"""

from __future__ import annotations

from geopilot.training.config import EvalConfig

METRICS = ("TSA", "PA", "NTA", "OPA")


class PlanningProbe:
    def __init__(self, cfg: EvalConfig, processor):
        from geopilot.eval.cases import load_cases
        from geopilot.eval.toolkit import build_tool_layer

        self.case_set = load_cases(cfg.planning_cases)
        self.cases = self.case_set.cases[: cfg.planning_max_cases]
        self.seeds = list(cfg.planning_seeds)
        self.registry, _ = build_tool_layer()
        self.generation = {"max_new_tokens": cfg.planning_max_new_tokens}
        self.processor = processor

    def scores(self, accelerator, model) -> dict:
        """Collective. {"val/planning/TSA": ..., ...}; a metric with no applicable case is left out."""
        import torch
        from accelerate.utils import gather_object

        from geopilot.agent import GeoPilot
        from geopilot.eval.agents import GeoPilotAgent
        from geopilot.eval.cases import DIFFICULTIES
        from geopilot.eval.metrics import summarise
        from geopilot.eval.scorer import score

        unwrapped = accelerator.unwrap_model(model)
        pilot = GeoPilot(unwrapped, self.processor, self.registry)
        agent = GeoPilotAgent("in-training", self.registry, self.generation, pilot=pilot)
        pairs = [(seed, case) for seed in self.seeds for case in self.cases]
        rows = []
        was_training = unwrapped.training
        unwrapped.eval()
        # the agent seeds torch per case; training's random streams must not move (evaluation is result-neutral)
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            for seed, case in pairs[accelerator.process_index :: accelerator.num_processes]:
                run = agent.run(case, self.case_set.image_paths(case), seed)
                rows.append(
                    {
                        "case_id": case.id,
                        "seed": seed,
                        "category": case.category,
                        "difficulty": case.difficulty,
                        "modality": case.modality,
                        "run": run.model_dump(mode="json"),
                        "score": score(case, run).model_dump(mode="json"),
                    }
                )
        finally:
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            if was_training:
                unwrapped.train()
        every = [row for part in gather_object([rows]) for row in part]
        summary = summarise(every, list(dict.fromkeys(c.category for c in self.cases)), list(DIFFICULTIES))
        out = {f"val/planning/{m}": summary[m] for m in METRICS if summary[m] is not None}
        out["val/planning/infra_errors"] = summary["infra_errors"]
        return out
