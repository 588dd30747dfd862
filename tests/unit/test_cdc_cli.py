"""`cdc`'s own command line: its help lists the commands, a mistyped command is named as one
(not sent to the server as a table), every option has help, and --version. Streaming with
``cdc DB.TABLE`` is tested against the service in test_client.py."""

from __future__ import annotations

import pytest

import mariadb_cdc_client
from mariadb_cdc_client import cli


def _exits(argv: list[str]) -> int:
    """The exit code of an argparse action that exits (--help, --version)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    code = exited.value.code
    assert isinstance(code, int)
    return code


def test_help_lists_every_command_with_what_it_does(capsys):
    assert _exits(["--help"]) == 0
    shown = capsys.readouterr().out
    assert "cdc [options] DATABASE.TABLE[.VERSION] [GTID]" in shown
    assert "cdc COMMAND [options]" in shown
    for name, command in cli.COMMANDS.items():
        assert f"  {name} " in shown and command.summary in shown, name
    assert set(cli.COMMANDS) == {"dump", "dumps", "last-transaction", "transaction",
                                 "auth-string", "kafka"}


@pytest.mark.parametrize(("argv", "meant"), [
    (["dumsp"], "dumps"),
    (["dumsp", "-u", "u", "-p", "p", "shop.orders"], "dumps"),
    (["transacton", "0-1-5"], "transaction"),
    (["last-transacton"], "last-transaction"),
])
def test_a_mistyped_command_is_named_with_the_one_meant(argv: list[str], meant: str, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    assert capsys.readouterr().err == \
        f"cdc: unknown command '{argv[0]}', did you mean '{meant}'?\n"


def test_a_command_after_the_options_is_named_as_one(capsys):
    assert cli.main(["-u", "u", "-p", "p", "dumps"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == "cdc: a command comes before the options: " \
                                      "cdc dumps [options]\n"


def test_a_word_like_no_command_is_still_not_a_table(capsys):
    assert cli.main(["orders"]) == cli.EXIT_USAGE
    assert "'orders' is not db.table" in capsys.readouterr().err


def test_version(capsys):
    assert _exits(["--version"]) == 0
    assert capsys.readouterr().out == f"cdc {mariadb_cdc_client.__version__}\n"


def test_every_option_of_every_command_has_help():
    parsers = [cli._stream_parser(), *(command.parser() for command in cli.COMMANDS.values())]
    missing = [f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
               for parser in parsers for action in parser._actions
               if not action.help]
    assert missing == []


def test_cdc_kafka_reads_committed_transactions_only_when_asked():
    from mariadb_cdc_client import kafka_cli

    def options(*argv: str) -> dict[str, object]:
        return kafka_cli.consumer_options(kafka_cli.parser().parse_args(["t", *argv]))

    assert options("--read-committed")["isolation_level"] == "read_committed"
    assert "isolation_level" not in options()
