"""`inference-studio generate`: prompts in, replies out, all submitted at once and batched by the engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli.options import add_engine_options, add_model_options, engine_options_from
from engine.core.engine_thread import EngineThread
from engine.errors import InvalidRequestError, StudioError
from engine.launch import start_engine
from engine.types import FinishReason, SamplingParams, validate_messages


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    prompts = parser.add_argument_group("prompts")
    prompts.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    prompts.add_argument(
        "--prompts-file",
        type=Path,
        metavar="FILE",
        help='JSON Lines: {"prompt": "..."} or {"messages": [{"role": ..., "content": ...}, ...]} per line',
    )
    prompts.add_argument("--system", default=None, help="system prompt for plain prompts")
    prompts.add_argument("--raw", action="store_true", help="do not apply the chat template")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=256)
    sampling.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    sampling.add_argument("--top-p", type=float, default=1.0)
    sampling.add_argument("--top-k", type=int, default=0)
    sampling.add_argument("--min-p", type=float, default=0.0)
    sampling.add_argument("--repetition-penalty", type=float, default=1.0)
    sampling.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI's, over the reply (-2 to 2)")
    sampling.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI's, over the reply (-2 to 2)")
    sampling.add_argument("--seed", type=int, default=None)
    sampling.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    sampling.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    add_engine_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt, in input order")
    parser.set_defaults(handler=run)


def read_prompts_file(path: Path) -> list[dict]:
    """Entries of a JSON Lines prompts file; a broken line is reported with its number."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read prompts file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidRequestError(f"prompts file {path} is not UTF-8 text") from None
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"prompts file {path} line {number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(entry, dict) or not ("prompt" in entry or "messages" in entry):
            raise InvalidRequestError(f'{where}: expected an object with "prompt" or "messages"')
        if "prompt" in entry and (not isinstance(entry["prompt"], str) or not entry["prompt"].strip()):
            raise InvalidRequestError(f'{where}: "prompt" must be a non-empty string')
        if "messages" in entry:
            try:
                validate_messages(entry["messages"])
            except InvalidRequestError as exc:
                raise InvalidRequestError(f"{where}: {exc}") from None
        entries.append(entry)
    if not entries:
        raise InvalidRequestError(f"prompts file {path} holds no prompts")
    return entries


def collect_prompts(args: argparse.Namespace) -> list[dict]:
    entries: list[dict] = []
    for text in args.prompt:
        if not text.strip():
            raise InvalidRequestError("the prompt is empty")
        entries.append({"prompt": text})
    if args.prompts_file:
        entries.extend(read_prompts_file(args.prompts_file))
    if not entries:
        raise InvalidRequestError("nothing to generate: pass --prompt TEXT or --prompts-file FILE")
    if args.system:
        entries = [
            {"messages": [{"role": "system", "content": args.system}, {"role": "user", "content": e["prompt"]}]}
            if "prompt" in e
            else e
            for e in entries
        ]
    return entries


def sampling_params_from(args: argparse.Namespace) -> SamplingParams:
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )
    params.validate()
    return params


def run(args: argparse.Namespace) -> int:
    entries = collect_prompts(args)  # bad input fails before the model loads
    params = sampling_params_from(args)
    options = engine_options_from(args)
    options.check()

    def progress(message: str) -> None:
        print(f"[{message}]", file=sys.stderr, flush=True)

    # progress only on an interactive terminal: scripts get stdout/stderr with nothing but results and errors
    show_progress = not args.json and sys.stderr.isatty()
    engine = start_engine(options, progress=progress if show_progress else None)
    with EngineThread(engine) as worker:
        handles = []
        errors: list[str | None] = []
        for entry in entries:
            try:
                handle = worker.submit(
                    prompt=entry.get("prompt"), messages=entry.get("messages"), raw=args.raw, params=params
                )
                handles.append(handle)
                errors.append(None)
            except StudioError as exc:
                if len(entries) == 1:
                    raise
                handles.append(None)
                errors.append(str(exc))
        if args.json:
            return _print_json(handles, errors)
        return _stream_text(handles, errors)


def _print_json(handles, errors) -> int:
    failed = 0
    for index, (handle, error) in enumerate(zip(handles, errors, strict=True)):
        if handle is None:
            failed += 1
            print(json.dumps({"index": index, "error": error, "finish_reason": FinishReason.ERROR}), flush=True)
            continue
        result = handle.result()
        stats = result.stats
        record = {
            "index": index,
            "text": result.text,
            "token_ids": result.token_ids,
            "prompt_tokens": result.prompt_tokens,
            "finish_reason": result.finish_reason,
            "ttft_s": stats.ttft_s if stats else None,
            "decode_tokens_per_s": stats.decode_tokens_per_s if stats else None,
            "cached_prompt_tokens": stats.cached_prompt_tokens if stats else 0,
            "preemptions": stats.preemptions if stats else 0,
        }
        if result.error:
            record["error"] = result.error
            failed += 1
        print(json.dumps(record, ensure_ascii=False), flush=True)
    return 1 if failed else 0


def _stream_text(handles, errors) -> int:
    failed = 0
    many = len(handles) > 1
    for index, (handle, error) in enumerate(zip(handles, errors, strict=True)):
        if many:
            print(f"{'' if index == 0 else chr(10)}── reply {index + 1} ──", flush=True)
        if handle is None:
            print(f"inference-studio: error: {error}", file=sys.stderr)
            failed += 1
            continue
        for event in handle.events():
            if event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            if event.finished:
                sys.stdout.write("\n")
                if event.error:
                    print(f"inference-studio: error: {event.error}", file=sys.stderr)
                    failed += 1
                elif event.stats:
                    s = event.stats
                    rate = f", {s.decode_tokens_per_s:.1f} tok/s" if s.decode_tokens_per_s else ""
                    ttft = f"{s.ttft_s:.2f}" if s.ttft_s is not None else "-"
                    print(
                        f"[{s.output_tokens} tokens, {event.finish_reason}, TTFT {ttft} s{rate}]",
                        file=sys.stderr,
                        flush=True,
                    )
    return 1 if failed else 0
