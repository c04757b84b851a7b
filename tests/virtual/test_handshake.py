"""Virtual devices as the real adb server sees them: listed, identified, several SoCs at once."""

from __future__ import annotations

from farm.virtual import VirtualDeviceSpec


def _by_soc(vf):
    return {r.soc: r for r in vf.devices}


def test_devices_listed_in_state_device(shared_virtual_farm):
    vf = shared_virtual_farm
    listed = {info.serial: info.state for info in vf.client().list()}
    assert {r.serial for r in vf.devices} <= set(listed)
    assert all(listed[r.serial] == "device" for r in vf.devices)


def test_getprop_identifies_the_soc(shared_virtual_farm):
    d = shared_virtual_farm.client().device(_by_soc(shared_virtual_farm)["SM8650"].serial)
    assert d.shell("getprop ro.soc.model") == "SM8650"
    assert d.shell("getprop ro.board.platform") == "pineapple"
    assert d.shell("getprop ro.product.cpu.abi") == "arm64-v8a"
    assert d.shell("getprop ro.ptefarm.virtual") == "1"
    assert d.prop.model == "SM-S928B"


def test_platform_only_device_has_no_soc_model(shared_virtual_farm):
    d = shared_virtual_farm.client().device(_by_soc(shared_virtual_farm)["SM8550"].serial)
    assert d.shell("getprop ro.soc.model") == ""
    assert d.shell("getprop ro.board.platform") == "kalama"
    assert "[ro.soc.model]" not in d.shell("getprop")


def test_getprop_lists_all_in_android_format(shared_virtual_farm):
    r = _by_soc(shared_virtual_farm)["SM8650"]
    out = shared_virtual_farm.client().device(r.serial).shell("getprop").splitlines()
    assert "[ro.soc.model]: [SM8650]" in out
    assert f"[ro.ptefarm.workspace]: [{r.workspace}]" in out
    assert all(line.startswith("[") and "]: [" in line for line in out)


def test_features_and_workspace(shared_virtual_farm):
    r = _by_soc(shared_virtual_farm)["SM8650"]
    d = shared_virtual_farm.client().device(r.serial)
    features = set(d.get_features().split(","))
    assert {"shell_v2", "stat_v2", "ls_v2", "fixed_push_mkdir"} <= features
    workspace = d.shell("getprop ro.ptefarm.workspace")
    assert workspace == r.workspace == "/data/local/tmp/ptefarm"  # an Android path, as on a phone
    assert r.host_path(workspace).is_dir() and d.shell(f"test -d {workspace} && echo yes") == "yes"
    assert d.shell("pwd") == "/"  # commands run at / of the device's view, as adb shell on a phone


def test_dumpsys_battery(shared_virtual_farm):
    d = shared_virtual_farm.client().device(shared_virtual_farm.devices[0].serial)
    out = d.shell("dumpsys battery")
    assert "  level: 87" in out.splitlines()
    assert "  temperature: 312" in out.splitlines()


def test_several_socs_and_free_space(virtual_farm):
    devs = virtual_farm.up([VirtualDeviceSpec(soc="SM8750"), VirtualDeviceSpec(soc="SM8450"),
                            VirtualDeviceSpec(soc="SM8850", serial_hint="LAB42",
                                              free_bytes=10 << 20)])
    client = virtual_farm.client()
    assert [client.device(r.serial).shell("getprop ro.board.platform") for r in devs] == \
        ["sun", "taro", "canoe"]
    third = client.device(devs[2].serial)
    assert third.shell("getprop ro.serialno") == "LAB42"
    assert third.shell("df -k /data").splitlines()[1].split()[3] == str(10 << 10)
    assert len({r.port for r in devs}) == 3
    assert all(not 5554 <= r.port <= 5585 for r in devs)
