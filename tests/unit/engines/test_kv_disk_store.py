"""The disk tier's file format and store on a real filesystem: header and checksum, foreign and corrupt files,
the start-up scan, a full and an unwritable disk, FP8 blocks written with other scales; the host budget check."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from engines.base.errors import EngineUnavailableError
from engines.base.events import KvTier
from engines.base.types import KvLayout
from engines.core.tiers.kv_tiers import OnboardBlock, TierSpec
from engines.native.kv_cache import KvCache, bytes_per_block
from engines.native.tiers.disk_format import (
    BlockHeader,
    BlockIdentity,
    BlockSeal,
    CorruptBlockError,
    ForeignBlockError,
    ForgedBlockError,
    decode,
    encode,
)
from engines.native.tiers.disk_store import DirectoryInUseError, DiskStore
from engines.native.tiers.host_pool import check_host_budget
from engines.native.tiers.native_tiers import NativeTiers

IDENTITY = BlockIdentity("model-a", "float32", 4, (2, 1, 8))
PAYLOAD = bytes(range(256)) * 2
KEY = bytes(range(32))
SEAL = BlockSeal(KEY, b"/var/kv/worker-a")


def header(block_hash=0xAB12, parent=0x77, tokens=(1, 2, 3, 4), identity=IDENTITY, scales=()):
    return BlockHeader(identity, block_hash, parent, tokens, scales, len(PAYLOAD))


def file_bytes(h=None) -> bytes:
    return b"".join(bytes(p) for p in encode(h or header(), PAYLOAD, SEAL))


def written(store: DiskStore, h: BlockHeader) -> None:
    store.write(h, lambda: PAYLOAD)
    store.flush()


# -- format ------------------------------------------------------------------------------------
def test_a_block_file_round_trips_with_its_header():
    h, payload = decode(file_bytes(), IDENTITY, SEAL)
    assert h == header() and bytes(payload) == PAYLOAD


@pytest.mark.parametrize("where", [0, 20, 100, -3])
def test_any_flipped_byte_fails_the_check(where):
    data = bytearray(file_bytes())
    data[where] ^= 0x01
    with pytest.raises(CorruptBlockError):
        decode(bytes(data), IDENTITY, SEAL)


def test_a_truncated_file_fails_the_check():
    with pytest.raises(CorruptBlockError):
        decode(file_bytes()[:-10], IDENTITY, SEAL)


@pytest.mark.parametrize(
    "other",
    [
        BlockIdentity("model-b", "float32", 4, (2, 1, 8)),
        BlockIdentity("model-a", "bfloat16", 4, (2, 1, 8)),
        BlockIdentity("model-a", "float32", 8, (2, 1, 8)),
        BlockIdentity("model-a", "float32", 4, (2, 2, 8)),
    ],
)
def test_a_block_of_another_model_dtype_block_size_or_layout_is_foreign(other):
    with pytest.raises(ForeignBlockError):
        decode(file_bytes(header(identity=other)), IDENTITY, SEAL)


# -- the store ---------------------------------------------------------------------------------
def test_written_blocks_are_sharded_by_hash_read_back_and_found_by_a_scan(tmp_path):
    store = DiskStore(tmp_path, IDENTITY)
    written(store, header(0xAB12))
    written(store, header(0xCD34, parent=0xAB12, tokens=(5, 6, 7, 8)))
    assert store.poll() == [(0xAB12, True), (0xCD34, True)]
    assert store.path(0xAB12) == tmp_path / "00" / "000000000000ab12.kvb"
    payload, scales = store.read(0xAB12, 0x77, (1, 2, 3, 4))
    assert bytes(payload) == PAYLOAD and scales == ()
    os.utime(store.path(0xAB12), (1, 1))  # the oldest
    store.close()
    assert DiskStore(tmp_path, IDENTITY).scan() == [(0xAB12, 0x77, (1, 2, 3, 4)), (0xCD34, 0xAB12, (5, 6, 7, 8))]


def test_the_scan_leaves_foreign_files_and_removes_broken_ones(tmp_path):
    foreign = DiskStore(tmp_path, BlockIdentity("model-b", "float32", 4, (2, 1, 8)))  # this worker, another model
    written(foreign, header(0x22, identity=foreign.identity))
    foreign.close()
    store = DiskStore(tmp_path, IDENTITY)
    written(store, header(0x11))
    leftover = store.path(0x33).with_name("0000000000000033.kvb.tmp")
    leftover.parent.mkdir(exist_ok=True)
    leftover.write_bytes(b"half a write")
    garbage = store.path(0x44)
    garbage.parent.mkdir(exist_ok=True)
    garbage.write_bytes(b"not a block")
    assert [h for h, _, _ in store.scan()] == [0x11]
    assert store.path(0x22).exists() and not leftover.exists() and not garbage.exists()
    assert store.num_refused == 1  # the garbage; a leftover of an interrupted write is not an attack
    store.close()


def test_reading_a_block_that_is_not_the_one_asked_for_is_corrupt(tmp_path):
    store = DiskStore(tmp_path, IDENTITY)
    written(store, header(0x11))
    with pytest.raises(CorruptBlockError):
        store.read(0x11, 0x77, (9, 9, 9, 9))  # another block's tokens under this hash
    assert not store.path(0x11).exists()
    with pytest.raises(CorruptBlockError):
        store.read(0x12, 0x77, (1, 2, 3, 4))  # no file
    store.close()


def test_deletes_remove_files(tmp_path):
    store = DiskStore(tmp_path, IDENTITY)
    written(store, header(0x11))
    store.delete([0x11, 0x99])
    store.flush()
    assert not store.path(0x11).exists()
    store.close()


def test_an_unwritable_directory_stops_writes_with_one_warning(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory should be")
    store = DiskStore(blocker / "kv", IDENTITY)
    assert not store.is_writable
    written(store, header(0x11))
    written(store, header(0x12))
    assert store.poll() == [(0x11, False), (0x12, False)]
    assert store.scan() == []
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    store.close()


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 64 KiB tmpfs, really full after a few blocks; skipped where mounting is not allowed."""
    mount = tmp_path / "full"
    mount.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a small tmpfs needs privileges this machine does not give")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_stops_writes_with_one_warning(tiny_filesystem, caplog):
    store = DiskStore(tiny_filesystem, IDENTITY)
    results = []
    for i in range(200):  # ~560 bytes a block: the 64 KiB run out
        written(store, header(i + 1))
        results += store.poll()
    assert results[0] == (1, True)
    first_failure = next(i for i, (_, ok) in enumerate(results) if not ok)
    assert all(not ok for _, ok in results[first_failure:])  # stopped for good
    assert not store.is_writable
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    assert not list(tiny_filesystem.glob("??/*.tmp"))  # no half-written file left behind
    store.close()


# -- FP8 blocks and the host budget -------------------------------------------------------------
def test_an_fp8_block_written_with_other_scales_is_requantized_on_load(tmp_path):
    layout = KvLayout(2, 1, 4, "float8_e4m3fn", 2)
    theirs, ours = (0.5, 0.25, 1.0, 2.0), (1.0, 1.0, 2.0, 0.5)
    values = torch.randn(2, 2, 2, 1, 4, generator=torch.Generator().manual_seed(0)) * 0.5
    scale_view = torch.tensor(theirs).view(2, 2, 1, 1, 1)
    raw = (values / scale_view).to(torch.float8_e4m3fn).view(torch.uint8).contiguous()
    identity = BlockIdentity("m", layout.dtype, 2, (2, 1, 4))
    cache = KvCache(layout, num_blocks=2, device="cpu", scales=ours)
    spec = TierSpec(num_host_blocks=2, num_disk_blocks=2, block_bytes=bytes_per_block(layout))
    tiers = NativeTiers(cache, spec, str(tmp_path), "m")
    tiers.disk.write(BlockHeader(identity, 5, 0, (1, 2), theirs, raw.numel()), lambda: raw.numpy().tobytes())
    tiers.disk.flush()
    loaded = tiers._disk_block(OnboardBlock(KvTier.DISK, -1, 5, 0, (1, 2)))
    dequantized = loaded.view(torch.float8_e4m3fn).float() * torch.tensor(ours).view(2, 2, 1, 1, 1)
    original = raw.view(torch.float8_e4m3fn).float() * scale_view
    assert torch.allclose(dequantized, original, rtol=0.13, atol=1e-3)  # E4M3 keeps 3 mantissa bits
    assert not torch.equal(loaded, raw)  # really requantized, not copied
    tiers.close()


def test_a_host_budget_larger_than_the_machine_is_refused_clearly():
    with pytest.raises(EngineUnavailableError, match="only 8.0 GB of memory is available"):
        check_host_budget(int(100e9), int(8e9))
    check_host_budget(int(1e9), int(8e9))
    check_host_budget(int(1e9), 0)  # the machine does not say: allowed


# -- at rest: authenticated headers, one private directory per worker ------------------------------
def test_a_header_sealed_with_another_key_or_for_another_directory_is_forged():
    data = file_bytes()
    for other in (
        BlockSeal(bytes(32), b"/var/kv/worker-a"),
        BlockSeal(KEY, b"/var/kv/worker-b"),
        BlockSeal(None, b"/var/kv/worker-a"),
    ):
        with pytest.raises(ForgedBlockError, match="authentication"):
            decode(data, IDENTITY, other)


def test_a_payload_swapped_under_an_authentic_header_is_forged():
    data = bytearray(file_bytes())
    data[-len(PAYLOAD) :] = bytes(reversed(PAYLOAD))  # same length, other bytes
    with pytest.raises(ForgedBlockError, match="payload"):
        decode(bytes(data), IDENTITY, SEAL)


def test_files_are_0600_in_0700_directories_even_under_a_loose_umask(tmp_path):
    old = os.umask(0)
    try:
        store = DiskStore(tmp_path / "kv", IDENTITY, KEY)
        written(store, header(0x11))
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "kv").st_mode & 0o777) == "0o700"
    assert oct(os.stat(store.path(0x11).parent).st_mode & 0o777) == "0o700"
    assert oct(os.stat(store.path(0x11)).st_mode & 0o777) == "0o600"
    store.close()


def test_an_existing_loose_directory_is_tightened(tmp_path):
    (tmp_path / "kv").mkdir(mode=0o777)
    os.chmod(tmp_path / "kv", 0o777)
    DiskStore(tmp_path / "kv", IDENTITY, KEY).close()
    assert os.stat(tmp_path / "kv").st_mode & 0o777 == 0o700


def test_a_planted_file_is_refused_removed_and_counted_at_the_scan_and_on_read(tmp_path):
    store = DiskStore(tmp_path, IDENTITY, KEY)
    written(store, header(0x11))
    planted = store.path(0x22)  # an attacker's block, sealed without the deployment key
    planted.write_bytes(b"".join(bytes(p) for p in encode(header(0x22), PAYLOAD, BlockSeal(None, b"x"))))
    assert [h for h, _, _ in store.scan()] == [0x11]
    assert not planted.exists() and store.num_refused == 1
    store.path(0x11).write_bytes(b"".join(bytes(p) for p in encode(header(0x11), PAYLOAD, BlockSeal(None, b"x"))))
    with pytest.raises(CorruptBlockError):
        store.read(0x11, 0x77, (1, 2, 3, 4))  # swapped after the scan indexed it
    assert store.num_refused == 2 and not store.path(0x11).exists()
    store.close()


def test_another_workers_file_copied_in_is_refused(tmp_path):
    theirs = DiskStore(tmp_path / "decode-1", IDENTITY, KEY)  # same deployment key, its own directory
    written(theirs, header(0x11))
    theirs.close()
    ours = DiskStore(tmp_path / "decode-0", IDENTITY, KEY)
    copy = ours.path(0x11)
    copy.parent.mkdir(exist_ok=True)
    shutil.copyfile(theirs.path(0x11), copy)
    assert ours.scan() == [] and ours.num_refused == 1 and not copy.exists()
    assert DiskStore(tmp_path / "decode-1", IDENTITY, KEY).scan() == [(0x11, 0x77, (1, 2, 3, 4))]  # still its own


def test_a_restarted_worker_reads_its_own_blocks_with_the_same_key(tmp_path):
    store = DiskStore(tmp_path, IDENTITY, KEY)
    written(store, header(0x11))
    store.close()
    again = DiskStore(tmp_path, IDENTITY, KEY)
    assert again.scan() == [(0x11, 0x77, (1, 2, 3, 4))]
    assert bytes(again.read(0x11, 0x77, (1, 2, 3, 4))[0]) == PAYLOAD
    again.close()
    assert DiskStore(tmp_path, IDENTITY, bytes(32)).scan() == []  # a rotated key drops them (counted)


def test_two_live_workers_cannot_share_a_directory(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryInUseError, match="its own --kv-disk-dir"):
            DiskStore(tmp_path, IDENTITY, KEY)
    finally:
        holder.kill()
        holder.wait()
    DiskStore(tmp_path, IDENTITY, KEY).close()  # free again once the other worker is gone


_HOLD = """
import sys, time
from engines.native.tiers.disk_format import BlockIdentity
from engines.native.tiers.disk_store import DiskStore
store = DiskStore(sys.argv[1], BlockIdentity("model-a", "float32", 4, (2, 1, 8)))
print("held", flush=True)
time.sleep(60)
"""
