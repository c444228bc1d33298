"""Prints the node ids of the tests a JUnit XML report (``pytest --junitxml``) records as
skipped, one per line, for ``pytest @FILE`` to run them again once what they needed is there."""
import sys
import xml.etree.ElementTree as ET


def skipped(report: str) -> list[str]:
    ids = []
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("skipped") is None:
            continue
        module, _, cls = case.get("classname", "").partition(".Test")
        path = module.replace(".", "/") + ".py"
        ids.append(f"{path}::{'Test' + cls + '::' if cls else ''}{case.get('name')}")
    return ids


if __name__ == "__main__":
    print("\n".join(skipped(sys.argv[1])))
