"""`geopilot chat --model DIR [--adapter DIR] --image PATH [--image PATH ...] "question" [--json] [--out out.png]
[--tools-config configs/tools.yaml]`.

`--image` is repeatable: several images (before, after) are one conversation, in the order given (docs/design.md
§3); they must be one size, and at most `--max-images`.

Prints the plan (reasoning, tool calls), a short summary of each tool output, the answer and the timings;
`--json` prints the whole ChatResult instead; `--out` draws the tool outputs on the image.
Bad input (missing model, unreadable image, empty question) exits with code 2 and one line.
"""

from __future__ import annotations

import argparse
import sys

from geopilot.argtypes import add_deprecated_name, add_tools_config_argument
from geopilot.argtypes import bands as bands_type
from geopilot.sample import DEFAULT_MAX_IMAGES

SUMMARY_CHARS = 160
MAX_NEW_TOKENS = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="what to ask about the image")
    parser.add_argument("--model", required=True, help="model directory (from `geopilot init-model` or training)")
    parser.add_argument(
        "--adapter", default=None, help="a LoRA adapter dir from training (export/adapter); --model is then its base"
    )
    parser.add_argument(
        "--image",
        required=True,
        action="append",
        help="image file (PNG/JPEG/TIFF/GeoTIFF; SAR and 16-bit work); repeat it for several, in order (before, after)",
    )
    parser.add_argument(
        "--max-images",
        type=int,
        default=DEFAULT_MAX_IMAGES,
        help=f"most --image per question (default {DEFAULT_MAX_IMAGES})",
    )
    add_tools_config_argument(parser, old_names=("--tools",))
    parser.add_argument("--bands", type=bands_type, default=None, help="band numbers shown as RGB, e.g. 4,3,2")
    parser.add_argument(
        "--modality",
        choices=["optical", "sar"],
        default=None,
        help="what the image is; checks tool calls against it (default: inferred from the image, no check)",
    )
    parser.add_argument("--max-rounds", type=int, default=1, help="tool rounds the model may chain (default 1)")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"per generated turn (default {MAX_NEW_TOKENS}; a demo model's own)",
    )
    parser.add_argument(
        "--tool-timeout", type=float, default=None, help="seconds per tool call (default: the registry's)"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="default: as saved")
    parser.add_argument("--json", action="store_true", help="print the ChatResult as JSON")
    parser.add_argument("--out", metavar="PNG", default=None, help="write the image with boxes, masks and roads drawn")
    add_deprecated_name(parser, "--save-vis", "--out")


def _summary(call) -> str:
    from rich.markup import escape

    from geopilot.tool_output import llm_view
    from geopilot.wire import dumps

    if call.output is None:
        return f"[red]✗ {call.error_kind}[/]: {escape(str(call.error))}"
    text = dumps(llm_view(call.output))
    text = escape(text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 3] + "...")
    return (
        "[green]✓[/] "
        + text
        + (" [dim](provenance: annotations)[/]" if call.output.provenance == "annotations" else "")
    )


def _print_human(result, console) -> None:
    from rich.markup import escape

    from geopilot.wire import dumps

    for turn in result.turns:
        how = turn.parse if turn.parse != "failed" else f"unparsable: {turn.parse_error}"
        console.print(
            f"[bold]{turn.kind}[/] [dim]({escape(how)}; {turn.generated_tokens} tokens, {turn.seconds:.2f} s)[/]"
        )
        if turn.plan is not None and turn.plan.reasoning:
            console.print("  reasoning: " + escape(turn.plan.reasoning))
        for problem in turn.problems:
            console.print("  [yellow]invalid call[/]: " + escape(problem))
        for call in (c for c in result.tool_calls if turn.tool_round is not None and c.round == turn.tool_round):
            console.print(
                f"  → [cyan]{escape(call.tool)}[/] {escape(dumps(call.params))} [dim]({call.seconds:.2f} s)[/]"
            )
            console.print("    " + _summary(call))
    console.print(f"[bold]answer[/] [dim]({result.outcome})[/]: " + escape(result.answer))
    if result.error:
        console.print("[yellow]note[/]: " + escape(result.error))
    if result.bands is not None:
        console.print(f"[dim]bands shown: {','.join(map(str, result.bands))} ({escape(result.bands_reason)})[/]")
    for note in result.image_notes:
        console.print("[yellow]image[/]: " + escape(note))
    t = result.timings
    console.print(
        f"[dim]timings: load {t.image_load:.2f} s · encode {t.encode:.2f} s · think {t.think:.2f} s · repair {t.repair:.2f} s · "
        f"tools {t.tools:.2f} s · answer {t.answer:.2f} s · total {t.total:.2f} s[/]"
    )
    k = result.tokens
    console.print(
        f"[dim]tokens: prompt {k.prompt} ({k.image} image) · prefilled {k.input} · generated {k.generated}[/]"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from geopilot.agent import GeoPilot
    from geopilot.errors import GeoPilotInputError
    from geopilot.image import check_same_size, load_image

    if not args.question.strip():
        raise GeoPilotInputError("the question is empty")
    from geopilot.demo.model_note import read_model_note

    note = read_model_note(args.model) if args.adapter is None else {}
    if args.max_new_tokens is None:  # a demo model's own turn length: a quick one stops instead of decoding noise
        args.max_new_tokens = int(note.get("max_new_tokens") or MAX_NEW_TOKENS)
    if args.max_rounds < 0 or args.max_new_tokens < 1:
        raise GeoPilotInputError("--max-rounds must be >= 0 and --max-new-tokens >= 1")
    if args.tool_timeout is not None and not args.tool_timeout > 0:  # also NaN
        raise GeoPilotInputError(f"--tool-timeout must be a number of seconds > 0, got {args.tool_timeout:g}")
    if args.max_images < 1:
        raise GeoPilotInputError(f"--max-images must be >= 1, got {args.max_images}")
    if len(args.image) > args.max_images:
        raise GeoPilotInputError(f"{len(args.image)} --image given, over the limit of {args.max_images} (--max-images)")
    images = [load_image(path, bands=args.bands) for path in args.image]  # before the model loads: fail fast
    check_same_size(images)
    pilot = GeoPilot.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        tools_config=args.tools_config,
        tool_timeout_s=args.tool_timeout,
        adapter=args.adapter,
        max_images=args.max_images,
    )
    result = pilot.chat(
        images,
        args.question,
        max_rounds=args.max_rounds,
        modality=args.modality,
        generation={"max_new_tokens": args.max_new_tokens},
    )
    if args.out:
        from geopilot.visualize import draw_outputs

        draw_outputs(images[0].image, [c.output for c in result.tool_calls if c.output is not None]).save(args.out)
    if note.get("notice"):
        print(f"geopilot chat: note: {note['notice']}", file=sys.stderr)
    if args.json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        _print_human(result, Console(highlight=False))
        if args.out:
            print(f"visualisation: {args.out}")
    return 0
