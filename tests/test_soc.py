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

