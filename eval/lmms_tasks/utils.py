"""lmms-eval's hooks for GeoPilot's tasks: each one is `geopilot.eval.lmms_docs` (docs/lmms_eval.md).

lmms-eval loads this file by path beside the YAMLs; `process_docs` replaces the one-row `placeholder.jsonl` the
YAMLs name with the task's rows, read from the folder its GEOPILOT_<TASK>_DATA variable gives (never the hub).
"""

from datasets import Dataset

from geopilot.eval import lmms_docs
from geopilot.eval.lmms_docs import doc_to_text, doc_to_visual, process_results  # noqa: F401 - named by the YAMLs


def _docs(task):
    return lambda _placeholder: Dataset.from_list(lmms_docs.docs(task))


planning_docs = _docs("geopilot_planning")
rsvqa_lr_docs = _docs("geopilot_rsvqa_lr")
rsvqa_hr_docs = _docs("geopilot_rsvqa_hr")
referring_docs = _docs("geopilot_referring")
sar_vqa_docs = _docs("geopilot_sar_vqa")
captions_docs = _docs("geopilot_captions")


def _metric(key):
    return lambda values: lmms_docs.metric(key, values)


tsa, pa, nta, opa = (_metric(key) for key in lmms_docs.PLANNING_METRICS)
mean_of_types, pooled = (_metric(key) for key in lmms_docs.VQA_METRICS)
acc_at_05 = _metric("Acc@0.5")
bleu_1, bleu_2, bleu_3, bleu_4, rouge_l, cider = (_metric(key) for key in lmms_docs.TASK_METRICS["geopilot_captions"])
