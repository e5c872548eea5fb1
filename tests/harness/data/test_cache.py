import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from harness.data import cache
from harness.data.text_tokenizer import load_or_train, train_wordpiece


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def test_a_truncated_cached_tokenizer_is_reported_and_rebuilt(tmp_path):
    """It used to fail every later run with a pathless "EOF while parsing" and was never rebuilt."""
    path, trained = tmp_path / "tok.json", []

    def train():
        trained.append(1)
        return train_wordpiece(["a b c", "b c d"], vocab_size=50)

    first = load_or_train(path, train)
    assert load_or_train(path, train).get_vocab() == first.get_vocab() and len(trained) == 1  # cached
    _truncate(path)
    with pytest.warns(UserWarning, match=rf"cached tokenizer {path} cannot be read .*EOF while parsing"):
        again = load_or_train(path, train)
    assert len(trained) == 2 and again.get_vocab() == first.get_vocab()
    assert Tokenizer.from_file(str(path)).get_vocab() == first.get_vocab()  # the cache holds it again


def test_tokenizers_are_written_atomically(tmp_path, monkeypatch):
    written = []
    real = cache.atomic_write
    monkeypatch.setattr(cache, "atomic_write", lambda path, write: written.append(path) or real(path, write))
    load_or_train(tmp_path / "tok.json", lambda: train_wordpiece(["a b"], vocab_size=20))
    assert written == [tmp_path / "tok.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok.json", "tok.json.lock"]  # no temporary left


def test_atomic_write_leaves_nothing_when_the_write_fails(tmp_path):
    def fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        cache.atomic_write(tmp_path / "x.json", fail)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["truncate", "not a dict", "wrong keys"])
def test_a_damaged_cached_tensor_file_is_reported_and_rebuilt(tmp_path, damage):
    path, built = tmp_path / "t.pt", []

    def build():
        built.append(1)
        return {"x": torch.arange(1000)}

    cache.cached_tensors(path, build, keys=("x",))
    if damage == "truncate":
        _truncate(path)
    elif damage == "not a dict":
        torch.save(torch.arange(3), path)
    else:  # the right type, the wrong content (an entry of another format)
        torch.save({"train_ids": torch.arange(3)}, path)
    with pytest.warns(UserWarning, match=rf"cached tensors {path} cannot be read"):
        data = cache.cached_tensors(path, build, keys=("x",))
    assert len(built) == 2 and torch.equal(data["x"], torch.arange(1000))
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.arange(1000))


def test_cache_keys_carry_the_format_version(monkeypatch):
    before = cache.fingerprint("a", 1)
    monkeypatch.setattr(cache, "CACHE_FORMAT", cache.CACHE_FORMAT + 1)
    assert cache.fingerprint("a", 1) != before


def test_a_tokenizer_being_trained_is_waited_for_not_trained_again(tmp_path):
    """Cells started together share one tokenizer (a WordPiece trained twice may differ)."""
    import threading

    path, trained = tmp_path / "tok.json", []
    holding, release = threading.Event(), threading.Event()

    def slow_train():
        holding.set()
        release.wait(10)
        trained.append("first")
        return train_wordpiece(["a b c", "b c d"], vocab_size=50)

    first = threading.Thread(target=load_or_train, args=(path, slow_train))
    first.start()
    holding.wait(10)
    second = []
    waiter = threading.Thread(
        target=lambda: second.append(load_or_train(path, lambda: trained.append("second"))))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # waits for the lock
    release.set()
    first.join(10)
    waiter.join(10)
    assert trained == ["first"] and second[0].get_vocab() == Tokenizer.from_file(str(path)).get_vocab()


def test_the_cache_folder_is_the_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    assert cache.cache_dir(None, "mlm") == Path("results/cache/mlm")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "out" / "cache"))
    assert (cache.cache_dir(None, "mlm") == tmp_path / "out" / "cache" / "mlm"
            and (tmp_path / "out/cache/mlm").is_dir())
    # a workload's cache_dir param
    assert cache.cache_dir(str(tmp_path / "own"), "mlm") == tmp_path / "own" / "mlm"


def test_run_cache_names_the_folder_for_its_block_unless_set(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    with cache.run_cache(tmp_path / "cli" / "cache"):
        assert cache.cache_dir(None, "x") == tmp_path / "cli" / "cache" / "x"
    assert cache.CACHE_ENV not in os.environ  # a CLI call in a test leaves no trace
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "pipeline"))
    with cache.run_cache(tmp_path / "cli" / "cache"):
        assert cache.cache_dir(None, "x") == tmp_path / "pipeline" / "x"


def test_a_cache_entry_that_cannot_be_written_is_a_warning_not_a_failed_cell(tmp_path, monkeypatch):
    """A full disk while caching (torch.save raises RuntimeError there, not OSError): the tensors and the
    tokenizer built are used uncached, with a warning naming the file."""
    def full_disk(path, write, fsync=False):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(cache.atomic, "atomic_write", full_disk)
    built = {"x": torch.arange(3)}
    with pytest.warns(UserWarning, match=rf"cannot cache tensors at {tmp_path / 't.pt'} \(RuntimeError: "):
        assert cache.cached_tensors(tmp_path / "t.pt", lambda: built) is built
    with pytest.warns(UserWarning, match=rf"cannot cache tokenizer at {tmp_path / 'tok.json'} "
                                         r"\(RuntimeError"):
        tok = load_or_train(tmp_path / "tok.json", lambda: train_wordpiece(["a b c"], vocab_size=50))
    assert "a" in tok.get_vocab() and not (tmp_path / "t.pt").exists()
