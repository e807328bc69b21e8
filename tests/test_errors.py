"""gpusim's exceptions survive pickling, so that an error raised in a worker process reaches the caller."""

import importlib
import inspect
import pickle
import pkgutil
from concurrent.futures import ProcessPoolExecutor

import pytest

import gpusim
from gpusim.errors import UnknownPresetError, UnsupportedTraceError

SAMPLE_ARGUMENTS = {"known": ["a100-sxm4", "t3-ring8"]}
"""Arguments of exception constructors that are not text, by parameter name."""


def _exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of the gpusim package."""
    classes = set()
    for module_info in pkgutil.walk_packages(gpusim.__path__, "gpusim."):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                classes.add(value)
    return sorted(classes, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


def _instance(cls: type[BaseException]) -> BaseException:
    own_init = next((k.__init__ for k in cls.__mro__ if "__init__" in vars(k) and k.__module__.startswith("gpusim")), None)
    if own_init is None:  # a built-in exception's constructor: the message
        return cls("the message")
    parameters = list(inspect.signature(own_init).parameters.values())[1:]
    return cls(*(SAMPLE_ARGUMENTS.get(p.name, f"the {p.name}") for p in parameters))


def test_the_search_finds_the_exceptions_outside_errors_py():
    names = {cls.__qualname__ for cls in _exception_classes()}
    assert {"UnknownPresetError", "UnsupportedTraceError", "QuantityError", "ProtobufError"} <= names


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda cls: cls.__qualname__)
def test_every_exception_class_round_trips_through_pickle(cls):
    error = _instance(cls)
    error.add_note("a note")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error) and copy.args == error.args
    assert vars(copy) == vars(error)  # attributes such as UnknownPresetError.known, and the notes


def test_an_unsupported_trace_error_keeps_its_parts_and_renames_its_option_after_pickling():
    error = pickle.loads(pickle.dumps(UnsupportedTraceError("t.json: kernel 'x'", "them as delays", "unsupported='delay'")))
    assert error.naming("--unsupported delay").args[0] == "t.json: kernel 'x'; --unsupported delay replays them as delays"


def _load(name: str) -> None:
    gpusim.load_system(name)


def test_an_unknown_preset_in_a_worker_process_reaches_the_caller():
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(UnknownPresetError, match="unknown hardware preset 'h300'; known presets: .*t3-ring8"):
            pool.submit(_load, "h300").result()
