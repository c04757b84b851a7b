"""Devices behind adb servers: the farm's adb server, the device streams (shell, push, read) with
typed errors, what a device reports (props, SoC, battery, thermals, free space), discovery across
servers, and the fence that makes a device refuse the commands of a lease that no longer holds it."""
