"""The v1 license block (seed §8.1-8.2), aprender's MessagePack ``license`` entry and the
checks that enforce a license.

Golden block bytes are written out field by field from the layout in
aprfast/licensing.py.  The golden MessagePack entries were checked against the Rust
crate: ``rmp_serde::from_slice::<apr_format::LicenseInfo>`` (apr-format 0.72.3,
rmp-serde 1.3.1) reads each one and ``rmp_serde::to_vec_named`` writes the same bytes
back.
"""

import pickle
import struct
import threading
import uuid

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aprfast.errors import AprError, CorruptError, LayoutError, LimitError, SignatureError
from aprfast.v1 import licensing
from aprfast.v1.licensing import (
    LICENSE_BLOCK_FIXED_SIZE,
    AprenderLicenseEntry,
    InferenceCounter,
    License,
    LicenseError,
    check_license,
    compliance_metadata,
    decode_license_block,
    encode_license_block,
    from_aprender_entry,
    license_digest,
    licensee_hash,
    read_license_block,
    to_aprender_entry,
)
from aprfast.v1.licensing import (
    LicenseFlags as F,
)

LICENSE_ID = uuid.UUID("123e4567-e89b-12d3-a456-426614174000")
ACME = "ACME Corp"
ACME_SHA256 = "27de7f2960395e37c6ccc4edc084a5d205ea211cab04e9c19119bafe39ea977b"
JAN_2030 = 1893456000  # 2030-01-01T00:00:00Z


def acme_license(**changes):
    fields = dict(license_id=LICENSE_ID, licensee=ACME, issued_at=1700000000, expires_at=JAN_2030,
                  flags=F.SEATS_ENFORCED | F.EXPIRATION_ENFORCED, seat_limit=5,
                  inference_limit=0, custom_terms=b"terms")
    fields.update(changes)
    return License(**fields)


# --------------------------------------------------------------------------- the block

GOLDEN_BLOCK = bytes.fromhex(
    "123e4567e89b12d3a456426614174000"  # license_id
    + ACME_SHA256  # licensee_hash = SHA-256("ACME Corp")
    + "00f1536500000000"  # issued_at 1700000000
    + "80d8db7000000000"  # expires_at 1893456000
    + "03"  # flags SEATS_ENFORCED | EXPIRATION_ENFORCED
    + "0500"  # seat_limit 5
    + "00000000"  # inference_limit 0
    + "05000000"  # custom_terms_len 5
    + "7465726d73"  # "terms"
)


def test_block_bytes_are_the_documented_layout():
    assert LICENSE_BLOCK_FIXED_SIZE == 75
    assert encode_license_block(acme_license()) == GOLDEN_BLOCK
    assert decode_license_block(GOLDEN_BLOCK) == acme_license()


def test_licensee_is_stored_only_as_its_sha256():
    lic = acme_license()
    assert lic.licensee_hash.hex() == ACME_SHA256 == licensee_hash(ACME).hex()
    assert ACME.encode() not in encode_license_block(lic)
    assert lic.is_for(ACME) and not lic.is_for("acme corp")


licenses = st.builds(
    License,
    license_id=st.binary(min_size=16, max_size=16),
    licensee_hash=st.binary(min_size=32, max_size=32),
    issued_at=st.integers(0, 2**64 - 1),
    expires_at=st.integers(0, 2**64 - 1),
    flags=st.integers(0, 0x3F),
    seat_limit=st.integers(0, 2**16 - 1),
    inference_limit=st.integers(0, 2**32 - 1),
    custom_terms=st.binary(max_size=300),
)


@given(lic=licenses, prefix=st.binary(max_size=20), suffix=st.binary(max_size=20))
def test_every_license_survives_a_round_trip_anywhere_in_a_buffer(lic, prefix, suffix):
    block = encode_license_block(lic)
    assert len(block) == LICENSE_BLOCK_FIXED_SIZE + len(lic.custom_terms)
    assert decode_license_block(block) == lic
    found, end = read_license_block(prefix + block + suffix, len(prefix))
    assert found == lic and end == len(prefix) + len(block)


def test_every_truncation_is_corrupt():
    for size in range(len(GOLDEN_BLOCK)):
        with pytest.raises(CorruptError, match="truncated"):
            decode_license_block(GOLDEN_BLOCK[:size])


def test_trailing_bytes_are_corrupt():
    with pytest.raises(CorruptError, match="1 trailing"):
        decode_license_block(GOLDEN_BLOCK + b"\0")


def test_a_terms_length_beyond_the_bytes_present_is_corrupt_and_names_both():
    block = bytearray(GOLDEN_BLOCK)
    struct.pack_into("<I", block, 71, 0xFFFFFFFF)
    with pytest.raises(CorruptError, match="4294967295 bytes, only 5 follow"):
        decode_license_block(bytes(block))


def test_custom_terms_beyond_the_limit_are_refused_unless_the_limit_is_raised(monkeypatch):
    big = acme_license(custom_terms=b"x" * 100)
    block = encode_license_block(big)
    with pytest.raises(LimitError, match="100 bytes exceed the limit of 99"):
        decode_license_block(block, max_custom_terms=99)
    monkeypatch.setattr(licensing, "MAX_CUSTOM_TERMS_SIZE", 99)
    with pytest.raises(LimitError):
        decode_license_block(block)
    with pytest.raises(LimitError):  # a writer never writes what a reader would refuse
        encode_license_block(big)
    assert decode_license_block(block, max_custom_terms=100) == big


@pytest.mark.parametrize("flags", [0x40, 0x80, 0xC3])
def test_reserved_flag_bits_are_corrupt_in_a_block_and_refused_in_a_license(flags):
    block = bytearray(GOLDEN_BLOCK)
    block[64] = flags
    with pytest.raises(CorruptError, match="reserved bits"):
        decode_license_block(bytes(block))
    with pytest.raises(LayoutError, match="reserved bits"):
        acme_license(flags=flags)


def test_offsets_outside_the_buffer_are_corrupt():
    with pytest.raises(CorruptError, match="outside"):
        read_license_block(GOLDEN_BLOCK, len(GOLDEN_BLOCK) + 1)


# --------------------------------------------------------------------------- License fields


def test_license_id_accepts_a_uuid_its_bytes_or_its_string():
    assert (acme_license(license_id=LICENSE_ID) == acme_license(license_id=LICENSE_ID.bytes)
            == acme_license(license_id=str(LICENSE_ID)))
    assert acme_license().uuid == LICENSE_ID
    with pytest.raises(LayoutError, match="16 bytes"):
        acme_license(license_id=b"short")
    with pytest.raises(LayoutError, match="not a UUID"):
        acme_license(license_id="not-a-uuid")


def test_licensee_and_hash_must_agree_and_one_is_needed():
    by_hash = License(license_id=LICENSE_ID, licensee_hash=licensee_hash(ACME))
    assert by_hash == License(license_id=LICENSE_ID, licensee=ACME)
    assert License(license_id=LICENSE_ID, licensee=ACME, licensee_hash=licensee_hash(ACME)) == by_hash
    with pytest.raises(LayoutError, match="not the SHA-256"):
        License(license_id=LICENSE_ID, licensee=ACME, licensee_hash=licensee_hash("Other"))
    with pytest.raises(LayoutError, match="needs a licensee"):
        License(license_id=LICENSE_ID)


@pytest.mark.parametrize("field, value", [("seat_limit", 1 << 16), ("inference_limit", 1 << 32),
                                          ("issued_at", -1), ("expires_at", 1 << 64)])
def test_numbers_that_do_not_fit_their_field_are_refused(field, value):
    with pytest.raises(LayoutError, match=field):
        acme_license(**{field: value})


def test_booleans_and_floats_are_not_counts():
    with pytest.raises(TypeError):
        acme_license(seat_limit=True)
    with pytest.raises(TypeError):
        acme_license(expires_at=1.5)


def test_issue_draws_a_random_version_4_id_and_stamps_the_time():
    first = License.issue(ACME, now=1234)
    second = License.issue(ACME, now=1234)
    assert first.uuid.version == 4 and first.license_id != second.license_id
    assert first.issued_at == 1234 and first.is_for(ACME)


def test_licenses_are_immutable_and_flags_come_back_as_license_flags():
    lic = acme_license(flags=3)
    assert isinstance(lic.flags, F) and lic.flags == F.SEATS_ENFORCED | F.EXPIRATION_ENFORCED
    with pytest.raises(AttributeError):
        lic.seat_limit = 10


# --------------------------------------------------------------------------- aprender's entry

GOLDEN_ENTRY_FULL = bytes.fromhex(
    "86a475756964d92431323365343536372d653839622d313264332d613435362d343236363134313734303030"
    "a468617368d94063663338326134623330633035383265623261663535306265663164626238346131366236"
    "633735323133643931303735336238353036393365643265653334a6657870697279b4323033302d30312d30"
    "315430303a30303a30305aa5736561747305a86c6963656e736565a941434d4520436f7270a474696572a454"
    "65616d"
)
GOLDEN_ENTRY_MINIMAL = bytes.fromhex(
    "83a475756964d92431323365343536372d653839622d313264332d613435362d343236363134313734303030"
    "a468617368d94064373565366534636430353265646565663963613738393365396235323166316434306564"
    "313430343633363662326566616363396162383230663962666632a474696572aa456e7465727072697365"
)


def test_entry_packs_to_the_bytes_rmp_serde_writes():
    full = to_aprender_entry(acme_license(), tier="Team", licensee_name=ACME)
    assert list(full) == ["uuid", "hash", "expiry", "seats", "licensee", "tier"]
    assert full == {"uuid": str(LICENSE_ID), "hash": license_digest(acme_license()),
                    "expiry": "2030-01-01T00:00:00Z", "seats": 5, "licensee": ACME, "tier": "Team"}
    assert msgpack.packb(full) == GOLDEN_ENTRY_FULL

    plain = acme_license(flags=0, expires_at=0, seat_limit=0, custom_terms=b"")
    assert msgpack.packb(to_aprender_entry(plain)) == GOLDEN_ENTRY_MINIMAL


def test_entry_hash_is_the_sha256_of_the_block():
    import hashlib

    assert license_digest(acme_license()) == hashlib.sha256(GOLDEN_BLOCK).hexdigest()


@pytest.mark.parametrize("flags, expires_at, has_expiry", [
    (F.EXPIRATION_ENFORCED, JAN_2030, True),
    (F(0), JAN_2030, False),  # not enforced: aprender would read it as a real expiry
    (F.EXPIRATION_ENFORCED, 0, False),  # 0 = never: aprender's "None for perpetual"
])
def test_expiry_is_written_only_when_enforced(flags, expires_at, has_expiry):
    entry = to_aprender_entry(acme_license(flags=flags, expires_at=expires_at))
    assert ("expiry" in entry) is has_expiry


def test_seats_are_written_only_when_enforced_even_when_zero():
    assert "seats" not in to_aprender_entry(acme_license(flags=0))
    assert to_aprender_entry(acme_license(flags=F.SEATS_ENFORCED, seat_limit=0))["seats"] == 0


def test_entry_refuses_what_aprender_cannot_hold_or_a_mismatched_licensee():
    with pytest.raises(LayoutError, match="tier"):
        to_aprender_entry(acme_license(), tier="Gold")
    with pytest.raises(LayoutError, match="does not hash"):
        to_aprender_entry(acme_license(), licensee_name="Someone Else")
    with pytest.raises(LayoutError, match="9999"):
        to_aprender_entry(acme_license(expires_at=253402300800))


def test_entry_round_trips_through_msgpack_and_matches_its_license():
    lic = acme_license()
    entry = to_aprender_entry(lic, tier="Academic", licensee_name=ACME)
    read = from_aprender_entry(msgpack.unpackb(msgpack.packb(entry)))
    assert read.as_dict() == entry and list(read.as_dict()) == list(entry)
    assert read.expires_at == JAN_2030
    assert read.matches(lic)
    assert not read.matches(acme_license(seat_limit=6))  # another block, another hash
    assert not read.matches(acme_license(license_id=uuid.uuid4()))
    # An expiry ISO 8601 cannot spell never matches, and asking is not an error.
    assert not read.matches(acme_license(expires_at=2**63))
    wrong_seats = AprenderLicenseEntry(**{**read.__dict__, "seats": 6})
    assert not wrong_seats.matches(lic)


def test_entries_written_by_aprender_are_read_as_serde_reads_them():
    # core_io.rs test_save_with_metadata_license_sets_flag writes this entry.
    ours = from_aprender_entry({"uuid": "u", "hash": "h", "licensee": "X", "tier": "Enterprise"})
    assert ours == AprenderLicenseEntry(uuid="u", hash="h", tier="Enterprise", licensee="X")
    assert ours.expires_at is None and not ours.matches(acme_license())
    # nil optionals are None, unknown keys are ignored (serde has no deny_unknown_fields)
    assert from_aprender_entry({"uuid": "u", "hash": "h", "expiry": None, "seats": None,
                                "extra": 1, "tier": "Personal"}).as_dict() == \
        {"uuid": "u", "hash": "h", "tier": "Personal"}


@pytest.mark.parametrize("entry, problem", [
    ([1, 2], "is a map"),
    ({"hash": "h", "tier": "Team"}, "no 'uuid'"),
    ({"uuid": "u", "hash": None, "tier": "Team"}, "no 'hash'"),
    ({"uuid": "u", "hash": "h"}, "no 'tier'"),
    ({"uuid": "u", "hash": "h", "tier": "Gold"}, "not one of"),
    ({"uuid": "u", "hash": "h", "tier": 2}, "'tier' is int"),
    ({"uuid": 7, "hash": "h", "tier": "Team"}, "'uuid' is int"),
    ({"uuid": "u", "hash": "h", "seats": -1, "tier": "Team"}, "u32"),
    ({"uuid": "u", "hash": "h", "seats": 1 << 32, "tier": "Team"}, "u32"),
    ({"uuid": "u", "hash": "h", "seats": True, "tier": "Team"}, "'seats' is bool"),
    ({"uuid": "u", "hash": "h", "seats": 1.0, "tier": "Team"}, "'seats' is float"),
    ({"uuid": "u", "hash": "h", "expiry": 5, "tier": "Team"}, "'expiry' is int"),
])
def test_malformed_entries_are_corrupt(entry, problem):
    with pytest.raises(CorruptError, match=problem):
        from_aprender_entry(entry)


@pytest.mark.parametrize("text", ["2030-01-01", "2030-01-01T00:00:00Z", "2030-01-01T00:00:00",
                                  "2030-01-01T01:00:00+01:00", "2030-01-01T00:00:00.000z"])
def test_expiry_accepts_the_common_iso_8601_spellings(text):
    assert AprenderLicenseEntry(uuid="u", hash="h", tier="Team", expiry=text).expires_at == JAN_2030


def test_an_unreadable_expiry_is_corrupt():
    with pytest.raises(CorruptError, match="ISO 8601"):
        _ = AprenderLicenseEntry(uuid="u", hash="h", tier="Team", expiry="next tuesday").expires_at


# --------------------------------------------------------------------------- enforcement


def test_license_error_is_an_e006_permission_error_but_not_a_signature_error():
    err = LicenseError("expired", path="/models/m.apr")
    assert err.code == "E006" and err.category == "SIGNATURE"
    assert isinstance(err, AprError) and isinstance(err, PermissionError)
    assert not isinstance(err, SignatureError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is LicenseError and str(back) == str(err) and back.path == "/models/m.apr"


def test_expiry_is_enforced_from_the_expiry_second_on():
    lic = acme_license()
    check_license(lic, now=JAN_2030 - 1)
    with pytest.raises(LicenseError, match=r"expired at 2030-01-01T00:00:00Z \(expires_at=1893456000, "
                                           r"now=1893456000\)"):
        check_license(lic, now=JAN_2030)
    check_license(acme_license(flags=0), now=JAN_2030 + 10**6)  # flag not set
    check_license(acme_license(expires_at=0), now=2**63)  # 0 = never


def test_expiry_uses_the_clock_when_no_time_is_given():
    with pytest.raises(LicenseError, match="expired"):
        check_license(acme_license(expires_at=1))
    check_license(acme_license(expires_at=2**63))


def test_seats_are_enforced_when_counted():
    lic = acme_license()
    check_license(lic, now=0, seats_in_use=5)
    with pytest.raises(LicenseError, match="6 seats in use, seat_limit=5"):
        check_license(lic, now=0, seats_in_use=6)
    check_license(lic, now=0)  # aprfast cannot count seats it is not told about
    check_license(acme_license(flags=0), seats_in_use=1000)


def test_inferences_are_enforced_before_the_one_past_the_limit():
    lic = acme_license(flags=F.INFERENCE_LIMITED, inference_limit=3)
    check_license(lic, inferences_used=2)
    with pytest.raises(LicenseError, match="3 inferences used, inference_limit=3"):
        check_license(lic, inferences_used=3)


def test_the_licensee_is_checked_whatever_the_flags():
    check_license(acme_license(flags=0), licensee=ACME)
    with pytest.raises(LicenseError, match="licensee does not match"):
        check_license(acme_license(flags=0), licensee="Mallory")


def test_every_violated_term_is_named_in_one_error():
    lic = acme_license(flags=F.SEATS_ENFORCED | F.EXPIRATION_ENFORCED | F.INFERENCE_LIMITED,
                       inference_limit=10)
    with pytest.raises(LicenseError) as caught:
        check_license(lic, now=JAN_2030, seats_in_use=9, inferences_used=10, licensee="Mallory")
    message = str(caught.value)
    assert message.startswith(f"[E006] license {LICENSE_ID} refused: ")
    for part in ("licensee does not match", "expired", "9 seats in use", "10 inferences used"):
        assert part in message


def test_informational_flags_restrict_nothing():
    lic = acme_license(flags=F.WATERMARKED | F.REVOCABLE | F.TRANSFERABLE, expires_at=1)
    check_license(lic, now=2**63, seats_in_use=10**6, inferences_used=10**9)


def test_inference_counter_counts_up_to_the_limit_and_no_further():
    counter = InferenceCounter(acme_license(flags=F.INFERENCE_LIMITED, inference_limit=5), used=1)
    counter.consume(3)
    assert counter.used == 4 and counter.remaining == 1
    with pytest.raises(LicenseError, match="4 inferences used, 2 more requested, inference_limit=5"):
        counter.consume(2)
    assert counter.used == 4  # a refused request counts nothing
    counter.consume()
    assert counter.remaining == 0
    with pytest.raises(ValueError):
        counter.consume(-1)


def test_inference_counter_is_exact_across_threads():
    counter = InferenceCounter(acme_license(flags=F.INFERENCE_LIMITED, inference_limit=500))
    granted = []

    def worker():
        mine = 0
        for _ in range(100):
            try:
                counter.consume()
                mine += 1
            except LicenseError:
                pass
        granted.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 500 and counter.used == 500 and counter.remaining == 0


def test_inference_counter_refuses_an_expired_license_and_ignores_unlimited_ones():
    expired = InferenceCounter(acme_license(flags=F.EXPIRATION_ENFORCED, expires_at=10))
    with pytest.raises(LicenseError, match="expired"):
        expired.consume(now=10)
    unlimited = InferenceCounter(acme_license(flags=0))
    unlimited.consume(10**9)
    assert unlimited.remaining is None and unlimited.used == 10**9


# --------------------------------------------------------------------------- compliance (§8.7)


def test_compliance_metadata_is_the_seeds_object_in_the_seeds_order():
    made = compliance_metadata(export_control="EAR99", bias_audit_date="2025-01-15",
                               model_card_url="https://example.com/card",
                               data_retention_policy="https://example.com/retention",
                               gdpr_training_consent=True, zz_custom=1, aa_custom="x")
    assert list(made) == ["gdpr_training_consent", "data_retention_policy", "model_card_url",
                          "bias_audit_date", "export_control", "aa_custom", "zz_custom"]
    assert made["gdpr_training_consent"] is True and made["export_control"] == "EAR99"
    assert compliance_metadata() == {} and compliance_metadata(export_control="EAR99") == {"export_control": "EAR99"}


def test_compliance_metadata_checks_types_and_dates():
    with pytest.raises(TypeError, match="gdpr_training_consent is a bool"):
        compliance_metadata(gdpr_training_consent="yes")
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        compliance_metadata(bias_audit_date="15/01/2025")
