"""GeoPilotBench metrics as pure functions (no model, no I/O): VQA accuracy, caption BLEU/ROUGE-L/CIDEr-D,
rotated-polygon IoU and Acc@0.5, segmentation mIoU, referring-mask oIoU/mIoU and change-mask
precision/recall/F1/IoU. docs/eval_tasks.md defines each."""
