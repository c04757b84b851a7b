from farm.soc import HTP_ARCH_BY_SOC, SOC_BY_PLATFORM, htp_arch, soc_from_props


def test_htp_arch_follows_the_qualcomm_table():
    assert htp_arch("SM8650") == "v75"
    assert htp_arch("SM8550") == "v73"
    assert htp_arch("SM8450") == "v69"
    assert htp_arch("SM8750") == "v79"
    assert htp_arch("sm8850") == "v81"  # case-insensitive
    assert htp_arch("SM6375") is None  # no HTP we support
    assert htp_arch(None) is None


def test_ro_soc_model_wins_over_the_platform_codename():
    props = {"ro.soc.model": "SM8650", "ro.board.platform": "kalama"}
    assert soc_from_props(props) == "SM8650"


def test_platform_codename_is_the_fallback():
    assert soc_from_props({"ro.board.platform": "kalama"}) == "SM8550"
    assert soc_from_props({"ro.soc.model": "", "ro.board.platform": "Pineapple"}) == "SM8650"
    assert soc_from_props({"ro.board.platform": "sm8450"}) == "SM8450"  # part number as platform
    assert soc_from_props({"ro.board.platform": "holi"}) is None
    assert soc_from_props({}) is None


def test_every_codename_maps_to_a_soc_with_an_htp_arch():
    for codename, soc in SOC_BY_PLATFORM.items():
        assert soc in HTP_ARCH_BY_SOC, codename



def test_every_virtual_profile_has_an_htp_arch(tmp_path):
    """The virtual devices' SoCs come from this table: each has an HTP arch, and the farm reads the
    same arch back from the properties a virtual device reports, with or without ro.soc.model."""
    from farm.virtual.identity import SOC_PROFILES, VirtualDeviceSpec, make_identity

    assert SOC_PROFILES and "SM8635" not in SOC_PROFILES  # not in upstream's QcomChipset
    for soc, profile in SOC_PROFILES.items():
        assert profile.soc == soc and htp_arch(soc) == profile.htp_arch is not None
        for platform_only in (False, True):
            props = make_identity(VirtualDeviceSpec(soc=soc, platform_only=platform_only)).props
            assert htp_arch(soc_from_props(props)) == profile.htp_arch, (soc, platform_only)


def test_a_profile_outside_the_table_is_refused():
    import pytest

    from farm.virtual.identity import SocProfile, _profiles

    with pytest.raises(ValueError, match="SM8635"):
        _profiles(SocProfile("SM8635", "24053PY09I", "peridot", "peridot", "14", 34))
