"""Source-dataset readers: one module per dataset, each `read_<name>(root, split=...) -> (records, ReadReport)`.

`READERS` is the one table the generator looks readers up in (config `source:` names are its keys); `LAYOUTS`
names, per reader, the on-disk layouts it accepts (docs/datasets.md has each with its source), for the error a
source that yields nothing gets (`geopilot.data_gen.sources`).
Records carry geometry normalised to [0, 1]; bad items are skipped and counted per cause in the ReadReport
(causes in `common.py`); a missing/unusable root raises `DatasetRootError` (a GeoPilotInputError).
"""

from __future__ import annotations

from collections.abc import Callable

from geopilot.data_gen.readers.cityscale import read_cityscale
from geopilot.data_gen.readers.common import DatasetRootError, ReadResult
from geopilot.data_gen.readers.dior import read_dior
from geopilot.data_gen.readers.dota import LAYOUTS as DOTA_LAYOUTS
from geopilot.data_gen.readers.dota import read_dota
from geopilot.data_gen.readers.fair1m import read_fair1m
from geopilot.data_gen.readers.geochat import read_geochat
from geopilot.data_gen.readers.isaid import read_isaid
from geopilot.data_gen.readers.levir_cc import LAYOUT as LEVIR_CC_LAYOUT
from geopilot.data_gen.readers.levir_cc import read_levir_cc
from geopilot.data_gen.readers.levir_cd import LAYOUT as LEVIR_CD_LAYOUT
from geopilot.data_gen.readers.levir_cd import read_levir_cd
from geopilot.data_gen.readers.openearthmap import read_openearthmap
from geopilot.data_gen.readers.rice import read_rice
from geopilot.data_gen.readers.risbench import read_risbench
from geopilot.data_gen.readers.sardet import read_sardet
from geopilot.data_gen.readers.sarlang import read_sarlang
from geopilot.data_gen.readers.spacenet import LAYOUTS as SPACENET_LAYOUTS
from geopilot.data_gen.readers.spacenet import read_spacenet

READERS: dict[str, Callable[..., ReadResult]] = {
    "dota": read_dota,
    "dior": read_dior,
    "fair1m": read_fair1m,
    "risbench": read_risbench,
    "isaid": read_isaid,
    "openearthmap": read_openearthmap,
    "spacenet": read_spacenet,
    "cityscale": read_cityscale,
    "rice": read_rice,
    "geochat_instruct": read_geochat,
    "sarlang": read_sarlang,
    "sardet": read_sardet,
    "levir_cd": read_levir_cd,
    "levir_cc": read_levir_cc,
}

LAYOUTS: dict[str, tuple[str, ...]] = {
    "dota": DOTA_LAYOUTS,
    "dior": (
        "JPEGImages-{trainval,test}/*.jpg + Annotations/{Horizontal,Oriented} Bounding Boxes/*.xml + ImageSets/Main/<split>.txt",
        "Annotations/*.xml (older copies)",
    ),
    "fair1m": ("<split>/[part<N>/]{images/*.tif, labelXml[s]/*.xml} (v1.0 / v2.0)",),
    "risbench": ("img_rgb/*.png + mask/*.png + output_phrase_<split>.txt (CroBIM)",),
    "isaid": ("<split>/Annotations/{iSAID_<split>,instancesonly_filtered_<split>}.json + <split>/images/",),
    "openearthmap": ("<region>/{images,labels}/<region>_<n>.tif + <split>.txt",),
    "spacenet": SPACENET_LAYOUTS,
    "cityscale": ("[20cities/]region_<i>_sat.png + region_<i>_{refine_gt_graph,gt_graph}.p | _graph_gt.pickle",),
    "rice": ("RICE{1,2}/{cloud,label}/*.png (official)", "RICE{1,2}/{cloudy_image,ground_truth}/*.png (SpA-GAN)"),
    "geochat_instruct": (
        "GeoChat_Instruct.json + share/softwares/kartik/GeoChat_finetuning/final_images_llava/ (images.zip)",
        "GeoChat_Instruct.json + images/",
    ),
    "sarlang": ("SARimages/ + Text/{caption,VQA}/{Caption-training,SARVQA1_<split>,...}.{csv,json,jsonl}",),
    "sardet": ("Annotations/<split>.json + JPEGImages/[<split>/]",),
    "levir_cd": (LEVIR_CD_LAYOUT,),
    "levir_cc": (LEVIR_CC_LAYOUT,),
}

__all__ = ["LAYOUTS", "READERS", "DatasetRootError", "ReadResult"]
