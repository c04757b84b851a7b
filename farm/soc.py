"""Snapdragon SoCs: which Hexagon (HTP) architecture each has, and how a device names its SoC.

The HTP arch decides which QNN libraries a device needs (``libQnnHtpV75Stub.so`` and the v75 skel on an
SM8650). The table follows QcomChipset in ExecuTorch's Qualcomm backend (qc_schema.py): a SoC that is
not there has no HTP arch here either. Upstream never detects the SoC, the user passes it; the farm
reads it from the device: ``ro.soc.model`` (Android 12+) is authoritative, ``ro.board.platform`` (a
codename such as ``pineapple``) is the fallback.

This is the farm's one SoC table: virtual devices (farm.virtual.identity) take their SoCs, HTP archs and
codenames from it.
"""

from __future__ import annotations

HTP_ARCH_BY_SOC: dict[str, str] = {
    "SM8350": "v68", "SA8295": "v68", "SA8540": "v68", "QCM6490": "v68",
    "SM8450": "v69", "SM8475": "v69", "SXR2230P": "v69",
    "SM8550": "v73", "SA8255": "v73", "QCS9100": "v73", "SSG2115P": "v73", "SSG2125P": "v73",
    "SXR1230P": "v73",
    "SM8650": "v75",
    "SM8750": "v79", "SXR2330P": "v79",
    "SM8850": "v81", "SM8845": "v81", "SA8797": "v81", "SAR2230P": "v81", "SW6100": "v81",
}

# SoC -> its ro.board.platform codename, for the phone SoCs whose codename is known. A codename can
# cover a refresh of the same generation (SM8475 also reports "taro"): both share the HTP arch.
PLATFORM_BY_SOC: dict[str, str] = {
    "SM8350": "lahaina",
    "SM8450": "taro",
    "SM8475": "taro",
    "SM8550": "kalama",
    "SM8650": "pineapple",
    "SM8750": "sun",
    "SM8850": "canoe",
}

# ro.board.platform codename -> SoC. Only a fallback for devices without ro.soc.model; a shared
# codename means its first SoC above (the generation's base part).
SOC_BY_PLATFORM: dict[str, str] = {}
for _soc, _platform in PLATFORM_BY_SOC.items():
    SOC_BY_PLATFORM.setdefault(_platform, _soc)


def normalize_soc(value: str | None) -> str | None:
    """``sm8650`` and ``SM8650 `` are the same SoC; an empty property means unknown."""
    value = (value or "").strip().upper()
    return value or None


def soc_from_props(props: dict[str, str]) -> str | None:
    """The SoC a device reports: ``ro.soc.model`` wins, ``ro.board.platform`` via the codename table."""
    soc = normalize_soc(props.get("ro.soc.model"))
    if soc:
        return soc
    platform = (props.get("ro.board.platform") or "").strip().lower()
    if not platform:
        return None
    # Some vendors put the part number itself into ro.board.platform.
    return SOC_BY_PLATFORM.get(platform) or (normalize_soc(platform)
                                            if normalize_soc(platform) in HTP_ARCH_BY_SOC else None)


def htp_arch(soc: str | None) -> str | None:
    """The HTP arch (``"v75"``) of a SoC, None when the SoC is unknown or has no HTP we support."""
    return HTP_ARCH_BY_SOC.get(normalize_soc(soc) or "")
