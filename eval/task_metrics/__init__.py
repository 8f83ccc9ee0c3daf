"""GeoPilotBench metrics as pure functions (no model, no I/O): VQA accuracy, caption BLEU/ROUGE-L/CIDEr-D,
rotated-polygon IoU and Acc@0.5, segmentation mIoU and referring-mask oIoU/mIoU. docs/eval_tasks.md defines each."""
