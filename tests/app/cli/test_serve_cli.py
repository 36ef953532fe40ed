"""`inference-studio serve` refuses what cannot work with one line, before loading a model."""

from __future__ import annotations

import socket

from app.cli.main import main


def test_a_missing_api_key_is_one_line(capsys) -> None:
    code = main(["serve", "--api-key-from-keyring", "no-such-key"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no API key named 'no-such-key'" in err and "keyring set inference-studio no-such-key" in err


def test_a_taken_port_is_one_line(capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port), "--model", "/no/such/model"])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and len(err.strip().splitlines()) == 1


def test_bad_port_and_name(capsys) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    assert main(["serve", "--served-model-name", " "]) == 2
    err = capsys.readouterr().err
    assert "--port must be between 0 and 65535" in err and "--served-model-name must not be empty" in err
