from __future__ import annotations

import multiprocessing as mp

from graphcache import Artifact
from graphcache.stores import DiskStore, Store
from tests.fakes import make_artifact, spec


def test_put_get_exists_delete_keys(tmp_path):
    store = DiskStore(tmp_path)
    assert isinstance(store, Store)
    art = make_artifact(spec(), size=100_000)
    data = art.encode()
    assert store.get(art.key) is None and not store.exists(art.key)
    assert store.put(art.key, data) is True
    assert store.put(art.key, data) is False  # identical bytes: nothing written
    assert store.exists(art.key)
    assert store.get(art.key) == data
    assert list(store.keys()) == [art.key]
    assert store.delete(art.key) is True
    assert store.delete(art.key) is False
    assert store.get(art.key) is None


def test_small_and_large_values_read_back_identically(tmp_path):
    store = DiskStore(tmp_path)
    for size in (10, 40_000, 5 * 1024 * 1024):
        art = make_artifact(spec(seq_q=size // 8 * 8 or 8), size=size)
        store.put(art.key, art.encode())
        assert Artifact.decode(store.get(art.key), expected_key=art.key).payload == art.payload


def _writer(path: str, batch: int) -> None:
    store = DiskStore(path)
    art = make_artifact(spec(batch=batch), size=50_000)
    store.put(art.key, art.encode())
    store.close()


def test_shared_by_two_processes(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), b)) for b in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = DiskStore(tmp_path)
    keys = {make_artifact(spec(batch=b)).key for b in (1, 2)}
    assert set(store.keys()) == keys
    for key in keys:
        Artifact.decode(store.get(key), expected_key=key)


def test_lru_eviction_keeps_size_under_limit(tmp_path):
    limit = 2 * 1024 * 1024
    store = DiskStore(tmp_path, size_limit=limit, touch_interval=0)
    arts = [make_artifact(spec(batch=b), size=256 * 1024) for b in range(1, 21)]
    for art in arts:
        store.put(art.key, art.encode())
        store.get(arts[0].key)  # keep the first one hot
        assert store.volume() < limit + 512 * 1024
    kept = set(store.keys())
    assert arts[0].key in kept, "the most recently used entry must survive"
    assert arts[1].key not in kept, "an old unused entry must be evicted"
    assert len(kept) < len(arts)


def _spooled(store: DiskStore, data: bytes, name: str = "up") -> str:
    store.incoming.mkdir(parents=True, exist_ok=True)
    path = store.incoming / name
    path.write_bytes(data)
    return str(path)


def test_put_file_renames_the_written_file_into_place(tmp_path):
    """An upload written to the store's ``incoming`` folder becomes the value
    file itself: the same inode, nothing read into memory or copied."""
    import os

    store = DiskStore(tmp_path)
    art = make_artifact(spec(batch=7), size=200_000)
    path = _spooled(store, art.encode())
    inode = os.stat(path).st_ino
    assert store.put_file(art.key, path) is True
    assert not os.path.exists(path)
    fh, identity = store.open(art.key)
    fh.close()
    assert identity[0] == inode and store.get(art.key) == art.encode()
    # The same bytes again: nothing written, the file left to its writer.
    again = _spooled(store, art.encode(), "again")
    assert store.put_file(art.key, again) is False and os.path.exists(again)
    # Other bytes replace the entry; a pin asked for is kept, and kept by the next put.
    other = make_artifact(spec(batch=7), size=300_000).encode()
    assert store.put_file(art.key, _spooled(store, other, "other"), pin=True) is True
    assert store.get(art.key) == other and store.pinned(art.key)
    assert store.put_file(art.key, _spooled(store, art.encode(), "back")) is True and store.pinned(art.key)


def test_put_file_of_a_small_value_keeps_it_in_the_index(tmp_path):
    import os

    store = DiskStore(tmp_path)
    art = make_artifact(spec(batch=8), size=1000)
    path = _spooled(store, art.encode())
    assert store.put_file(art.key, path) is True
    assert os.path.exists(path)  # read, not renamed: the writer removes it
    assert store.get(art.key) == art.encode() and store.open(art.key)[1] is None


def test_make_room_evicts_least_recently_used_entries_under_the_limit(tmp_path):
    store = DiskStore(tmp_path, size_limit=1024 * 1024)
    arts = [make_artifact(spec(batch=b), size=200_000) for b in range(1, 5)]
    for art in arts:
        store.put(art.key, art.encode())
    store.make_room(arts[0].key, 600_000)
    assert store.exists(arts[0].key) and store.volume() + 600_000 <= 1024 * 1024
    assert not all(store.exists(a.key) for a in arts[1:])
