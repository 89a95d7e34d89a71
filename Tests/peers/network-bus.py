#!/usr/bin/python3
"""A private system bus with python-dbusmock's NetworkManager and ModemManager for end-to-end tests.

Starts dbus-daemon on a socket in --dir, prints `address ADDRESS`, starts the two templates and
adds what they lack (PrimaryConnection, Metered, Udi, RegistrationState, AccessTechnologies).
Then reads one JSON command per line on stdin and answers `ok` (or `error ...`) once done:
  {"op": "connect", "type": "802-11-wireless", "device_type": 2, "interface": "wlan0",
   "metered": 4, "modem": true}      the primary connection, its device (and a modem behind it)
  {"op": "set", "object": "manager|connection|device|modem|modem3gpp", "name": N, "value": V}
                                     UpdateProperties (emits PropertiesChanged); V an int is uint32
  {"op": "stop-nm"} / {"op": "start-nm"}   NetworkManager leaves the bus / comes back
  {"op": "freeze-nm"} / {"op": "thaw-nm"}  NetworkManager stops answering (SIGSTOP) / answers again
Runs on Debian's python3 (dbus and gi bindings) with PyPI's python-dbusmock 0.38 or later.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import dbus

NM = "org.freedesktop.NetworkManager"
NM_PATH = "/org/freedesktop/NetworkManager"
MM = "org.freedesktop.ModemManager1"
MOCK = "org.freedesktop.DBus.Mock"
CONNECTION = "/org/freedesktop/NetworkManager/ActiveConnection/test"
DEVICE = "/org/freedesktop/NetworkManager/Devices/test0"
MODEM = "/org/freedesktop/ModemManager1/Modems/8"
OBJECTS = {
    "manager": (NM, NM_PATH, NM),
    "connection": (NM, CONNECTION, NM + ".Connection.Active"),
    "device": (NM, DEVICE, NM + ".Device"),
    "modem": (MM, MODEM, MM + ".Modem"),
    "modem3gpp": (MM, MODEM, MM + ".Modem.Modem3gpp"),
}

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="signal"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
  </policy>
</busconfig>
"""


def wait_for_name(bus, name, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if bus.name_has_owner(name):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not appear")


def value(v):
    if isinstance(v, dict) and "string" in v:  # a string kept as a string (a wrong type on cue)
        return dbus.String(v["string"])
    if isinstance(v, bool):
        return dbus.Boolean(v)
    if isinstance(v, int):
        return dbus.UInt32(v)
    if isinstance(v, str) and v.startswith("/"):
        return dbus.ObjectPath(v)
    return v


class Bus:
    def __init__(self, directory):
        socket = os.path.join(directory, "system_bus_socket")
        config = os.path.join(directory, "bus.conf")
        with open(config, "w") as f:
            f.write(CONFIG.format(socket=socket))
        self.daemon = subprocess.Popen(["dbus-daemon", "--config-file", config, "--nofork", "--print-address"],
                                       stdout=subprocess.PIPE, text=True)
        self.address = self.daemon.stdout.readline().strip()
        self.env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=self.address)
        os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = self.address
        self.bus = dbus.bus.BusConnection(self.address)
        self.nm = None
        self.state = None
        self.mm = self.template("modemmanager", MM)

    def template(self, name, bus_name):
        process = subprocess.Popen([sys.executable, "-m", "dbusmock", "--system", "--template", name],
                                   env=self.env, stdout=subprocess.DEVNULL)
        wait_for_name(self.bus, bus_name)
        return process

    def obj(self, key):
        name, path, interface = OBJECTS[key]
        return dbus.Interface(self.bus.get_object(name, path), MOCK), interface

    def update(self, key, name, v):
        """Properties.Set on the mock, which emits PropertiesChanged (dbusmock's UpdateProperties
        cannot wrap an object path)."""
        bus_name, path, interface = OBJECTS[key]
        properties = dbus.Interface(self.bus.get_object(bus_name, path), "org.freedesktop.DBus.Properties")
        properties.Set(interface, name, v)

    def start_nm(self):
        self.nm = self.template("networkmanager", NM)
        manager, interface = self.obj("manager")
        manager.AddProperty(interface, "PrimaryConnection", dbus.ObjectPath("/"))
        manager.AddProperty(interface, "Metered", dbus.UInt32(0))
        if self.state:
            self.connect(self.state)

    def stop_nm(self):
        # dbusmock handles SIGTERM in Python, which its GLib loop may not get back to while a
        # client keeps it busy: after 2 s it is killed, which leaves the bus all the same.
        self.nm.terminate()
        try:
            self.nm.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.nm.kill()
            self.nm.wait()
        deadline = time.time() + 10
        while self.bus.name_has_owner(NM) and time.time() < deadline:
            time.sleep(0.02)

    def connect(self, command):
        self.state = command
        root = dbus.Interface(self.bus.get_object(NM, NM_PATH), MOCK)
        for path in (CONNECTION, DEVICE):
            try:
                root.RemoveObject(path)
            except dbus.exceptions.DBusException:
                pass
        root.AddObject(DEVICE, NM + ".Device", {
            "DeviceType": dbus.UInt32(command.get("device_type", 2)),
            "Interface": command.get("interface", "wlan0"),
            "Metered": dbus.UInt32(command.get("metered", 0)),
            "Udi": dbus.String(MODEM if command.get("modem") else "/sys/devices/test0"),
        }, [])
        root.AddObject(CONNECTION, NM + ".Connection.Active", {
            "Type": command.get("type", "802-11-wireless"),
            "Devices": dbus.Array([dbus.ObjectPath(DEVICE)], signature="o"),
        }, [])
        if command.get("modem"):
            mm_root = dbus.Interface(self.bus.get_object(MM, "/org/freedesktop/ModemManager1"), MOCK)
            try:
                mm_root.RemoveObject(MODEM)
            except dbus.exceptions.DBusException:
                pass
            mm_root.AddObject(MODEM, MM + ".Modem", {
                "AccessTechnologies": dbus.UInt32(command.get("access", 1 << 14)),
            }, [])
            modem, _ = self.obj("modem")
            modem.AddProperty(MM + ".Modem.Modem3gpp", "RegistrationState", dbus.UInt32(command.get("registration", 1)))
        self.update("manager", "PrimaryConnection", dbus.ObjectPath(CONNECTION))

    def set(self, key, name, v):
        self.update(key, name, value(v))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    bus = Bus(args.dir)
    bus.start_nm()
    print("address " + bus.address, flush=True)
    try:
        for line in sys.stdin:
            command = json.loads(line)
            try:
                op = command["op"]
                if op == "connect":
                    bus.connect(command)
                elif op == "set":
                    bus.set(command["object"], command["name"], command["value"])
                elif op == "stop-nm":
                    bus.stop_nm()
                elif op == "start-nm":
                    bus.start_nm()
                elif op == "freeze-nm":
                    os.kill(bus.nm.pid, signal.SIGSTOP)
                elif op == "thaw-nm":
                    os.kill(bus.nm.pid, signal.SIGCONT)
                print("ok", flush=True)
            except Exception as error:  # the test reads the reason
                print("error " + str(error).replace("\n", " "), flush=True)
    finally:
        for process in (bus.nm, bus.mm, bus.daemon):
            if process:
                process.kill()
                process.wait()


if __name__ == "__main__":
    main()
