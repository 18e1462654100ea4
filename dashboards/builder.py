"""A small typed builder for Grafana dashboards over the InfluxQL datasource.

Only what iotwatch's dashboards need: rows, five panel types (time series, stat, table,
bar gauge, geomap), raw InfluxQL targets, query variables from ``SHOW TAG VALUES``,
InfluxQL annotations, thresholds, units, colours and value mappings. Every object turns
into Grafana's dashboard JSON model with :meth:`to_dict`; the output is deterministic
(panel ids and grid positions are assigned in order), so the committed JSON can be
compared with a fresh build.

Grafana migrates older schema versions when it loads a dashboard, so the JSON written here
keeps to fields that have been stable for many releases (schemaVersion 39, Grafana 10+).

Why not Grafana's ``grafana-foundation-sdk``: its builders (every release on the package index,
generated for Grafana 10.1 to 11.6 and for its main branch) cover the panels, variables and
thresholds, but have no InfluxDB data source: no typed InfluxQL target (``query``,
``rawQuery``, ``resultFormat``, ``alias``), and its ``AnnotationQuery`` has no ``query``,
``textColumn`` or ``tagsColumn``, the fields of an InfluxQL annotation. Every target and
annotation of these dashboards would be an untyped dict beside the SDK's builders.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

#: The datasource every panel, target, variable and annotation refers to: the uid the
#: provisioning file (deploy/grafana/provisioning/datasources/influxdb.yml) gives it.
DATASOURCE_UID = "iotwatch-influxdb"
DATASOURCE: dict[str, str] = {"type": "influxdb", "uid": DATASOURCE_UID}

#: The Grafana folder the dashboards live in (same as the provisioning provider's folder).
FOLDER = "iotwatch"

SCHEMA_VERSION = 39
GRID_WIDTH = 24

# Colours an operator reads at a glance: green is fine, orange needs a look, red needs action.
GREEN, YELLOW, ORANGE, RED, BLUE, PURPLE, GREY = "green", "yellow", "orange", "red", "blue", "purple", "text"
SEVERITY_COLOURS = {"critical": RED, "major": ORANGE, "warning": YELLOW}


def _ds() -> dict[str, str]:
    return dict(DATASOURCE)


def thresholds(base: str, *steps: tuple[float, str]) -> dict[str, Any]:
    """``thresholds(GREEN, (100, ORANGE), (1000, RED))``: base colour, then (from value, colour)
    steps, as Grafana's absolute thresholds."""
    return {
        "mode": "absolute",
        "steps": [{"color": base, "value": None}, *({"color": color, "value": value} for value, color in steps)],
    }


@dataclass(frozen=True)
class Target:
    """A raw InfluxQL query. ``alias`` may use ``$tag_<key>``, ``$col`` and ``$m``."""

    query: str
    alias: str | None = None
    format: Literal["time_series", "table"] = "time_series"

    def to_dict(self, ref_id: str) -> dict[str, Any]:
        target: dict[str, Any] = {
            "datasource": _ds(),
            "refId": ref_id,
            "query": self.query,
            "rawQuery": True,
            "resultFormat": self.format,
        }
        if self.alias:
            target["alias"] = self.alias
        return target


@dataclass(frozen=True)
class Override:
    """Field config for matching fields: by exact display name, or by regex (``regex=True``)."""

    match: str
    properties: dict[str, Any]
    regex: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "matcher": {"id": "byRegexp" if self.regex else "byName", "options": self.match},
            "properties": [{"id": key, "value": value} for key, value in self.properties.items()],
        }


def colour(match: str, color: str, regex: bool = False, **extra: Any) -> Override:
    """Pin a series' colour (and optionally more field-config properties, e.g. ``unit``)."""
    props: dict[str, Any] = {"color": {"mode": "fixed", "fixedColor": color}}
    for key, value in extra.items():
        props[key.replace("__", ".")] = value
    return Override(match, props, regex)


def colours(colour_of: dict[str, str], regex: bool = False) -> list[Override]:
    """:func:`colour` for each of several series: ``{name: colour}``."""
    return [colour(match, color, regex) for match, color in colour_of.items()]


def value_text(mapping: dict[str | int, tuple[str, str]]) -> list[dict[str, Any]]:
    """Value mappings: ``{1: ("UP", GREEN), 0: ("DOWN", RED)}``."""
    options = {
        str(value): {"text": text, "color": color, "index": index}
        for index, (value, (text, color)) in enumerate(mapping.items())
    }
    return [{"type": "value", "options": options}]


@dataclass(kw_only=True)
class Panel:
    """Fields every panel type shares; subclasses add their type's options."""

    title: str
    targets: Sequence[Target]
    description: str = ""
    unit: str | None = None
    decimals: int | None = None
    min: float | None = None
    max: float | None = None
    thresholds: dict[str, Any] = field(default_factory=lambda: thresholds(GREEN))
    color_mode: str = "palette-classic"
    fixed_color: str | None = None
    mappings: list[dict[str, Any]] = field(default_factory=list)
    overrides: Sequence[Override] = ()
    transformations: list[dict[str, Any]] = field(default_factory=list)
    min_interval: str | None = None  # e.g. "1m" for per-minute data: $__interval never goes below it
    repeat: str | None = None  # a variable name: one panel per selected value
    links: list[dict[str, Any]] = field(default_factory=list)
    width: int = 12
    height: int = 8

    type: ClassVar[str] = ""  # Grafana's panel type, set by each subclass

    def options(self) -> dict[str, Any]:
        return {}

    def custom(self) -> dict[str, Any]:
        return {}

    def to_dict(self, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
        if not self.targets:
            raise ValueError(f"panel {self.title!r} has no target")
        if len(self.targets) > 26:
            raise ValueError(f"panel {self.title!r} has too many targets")
        color: dict[str, Any] = {"mode": self.color_mode}
        if self.fixed_color:
            color["fixedColor"] = self.fixed_color
        defaults: dict[str, Any] = {
            "color": color,
            "custom": self.custom(),
            "mappings": self.mappings,
            "thresholds": self.thresholds,
        }
        for key in ("unit", "decimals", "min", "max"):
            if getattr(self, key) is not None:
                defaults[key] = getattr(self, key)
        panel: dict[str, Any] = {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "datasource": _ds(),
            "gridPos": grid,
            "fieldConfig": {"defaults": defaults, "overrides": [o.to_dict() for o in self.overrides]},
            "options": self.options(),
            "targets": [target.to_dict(chr(ord("A") + i)) for i, target in enumerate(self.targets)],
        }
        if self.transformations:
            panel["transformations"] = self.transformations
        if self.min_interval:
            panel["interval"] = self.min_interval
        if self.repeat:
            panel["repeat"] = self.repeat
            panel["repeatDirection"] = "h"
            panel["maxPerRow"] = max(1, GRID_WIDTH // self.width)
        if self.links:
            panel["links"] = self.links
        return panel


@dataclass(kw_only=True)
class TimeSeries(Panel):
    type: ClassVar[str] = "timeseries"
    unit: str | None = "short"
    draw_style: Literal["line", "bars", "points"] = "line"
    line_interpolation: Literal["linear", "smooth", "stepAfter", "stepBefore"] = "linear"
    fill_opacity: int = 10
    stacking: Literal["none", "normal"] = "none"
    point_size: int = 4
    show_points: Literal["auto", "never", "always"] = "auto"
    span_nulls: bool | int = False
    threshold_style: Literal["off", "line", "dashed", "area", "line+area", "dashed+area"] = "off"
    legend_calcs: Sequence[str] = ("mean", "max", "lastNotNull")
    axis_label: str = ""

    def custom(self) -> dict[str, Any]:
        return {
            "drawStyle": self.draw_style,
            "lineInterpolation": self.line_interpolation,
            "lineWidth": 1 if self.draw_style != "bars" else 0,
            "fillOpacity": self.fill_opacity if self.draw_style != "bars" else 80,
            "gradientMode": "none",
            "pointSize": self.point_size,
            "showPoints": self.show_points,
            "spanNulls": self.span_nulls,
            "stacking": {"mode": self.stacking, "group": "A"},
            "axisPlacement": "auto",
            "axisLabel": self.axis_label,
            "thresholdsStyle": {"mode": self.threshold_style},
        }

    def options(self) -> dict[str, Any]:
        legend = {"showLegend": True, "displayMode": "table", "placement": "bottom", "calcs": list(self.legend_calcs)}
        return {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}}


@dataclass(kw_only=True)
class Stat(Panel):
    type: ClassVar[str] = "stat"
    reduce: str = "lastNotNull"
    graph: bool = True
    stat_color: Literal["value", "background", "none"] = "background"
    text_mode: Literal["auto", "value", "value_and_name", "name", "none"] = "auto"
    width: int = 6
    height: int = 4
    color_mode: str = "thresholds"

    def options(self) -> dict[str, Any]:
        return {
            "reduceOptions": {"calcs": [self.reduce], "fields": "", "values": False},
            "orientation": "auto",
            "textMode": self.text_mode,
            "colorMode": self.stat_color,
            "graphMode": "area" if self.graph else "none",
            "justifyMode": "auto",
            "wideLayout": True,
        }


@dataclass(kw_only=True)
class Table(Panel):
    type: ClassVar[str] = "table"
    sort_by: str | None = "Time"  # newest first
    sort_desc: bool = True
    column_overrides: Sequence[Override] = ()
    color_mode: str = "thresholds"
    cell_colour: Literal["auto", "color-text", "color-background"] = "auto"

    def __post_init__(self) -> None:
        self.overrides = (*self.overrides, *self.column_overrides)

    def custom(self) -> dict[str, Any]:
        return {"align": "auto", "cellOptions": {"type": self.cell_colour}, "filterable": True}

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "showHeader": True,
            "cellHeight": "sm",
            "footer": {"show": False, "reducer": ["sum"], "fields": ""},
        }
        if self.sort_by:
            options["sortBy"] = [{"displayName": self.sort_by, "desc": self.sort_desc}]
        return options


@dataclass(kw_only=True)
class BarGauge(Panel):
    type: ClassVar[str] = "bargauge"
    reduce: str = "max"
    orientation: Literal["horizontal", "vertical", "auto"] = "horizontal"
    display: Literal["gradient", "lcd", "basic"] = "gradient"
    all_values: bool = False
    limit: int | None = None
    color_mode: str = "thresholds"

    def options(self) -> dict[str, Any]:
        reduce: dict[str, Any] = {"calcs": [self.reduce], "fields": "", "values": self.all_values}
        if self.limit:
            reduce["limit"] = self.limit
        return {
            "reduceOptions": reduce,
            "orientation": self.orientation,
            "displayMode": self.display,
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
            "minVizHeight": 16,
            "minVizWidth": 8,
            "maxVizHeight": 300,
        }


@dataclass(kw_only=True)
class Geomap(Panel):
    """Markers at (latitude, longitude) fields of a table-format frame."""

    type: ClassVar[str] = "geomap"

    latitude: str = "lat"
    longitude: str = "lon"
    center: tuple[float, float] = (0.0, 0.0)
    zoom: float = 2.0
    marker_colour: str = BLUE
    layer_name: str = "positions"
    color_mode: str = "fixed"

    def __post_init__(self) -> None:
        if self.fixed_color is None:
            self.fixed_color = self.marker_colour

    def options(self) -> dict[str, Any]:
        lat, lon = self.center
        return {
            "view": {"id": "fit", "lat": lat, "lon": lon, "zoom": self.zoom, "allLayers": True},
            "controls": {"showZoom": True, "mouseWheelZoom": True, "showAttribution": True},
            "basemap": {"type": "default", "name": "Basemap"},
            "layers": [
                {
                    "type": "markers",
                    "name": self.layer_name,
                    "tooltip": True,
                    "location": {"mode": "coords", "latitude": self.latitude, "longitude": self.longitude},
                    "config": {
                        "showLegend": False,
                        "style": {
                            "color": {"fixed": self.marker_colour},
                            "opacity": 0.8,
                            "symbol": {"fixed": "img/icons/marker/circle.svg", "mode": "fixed"},
                            "size": {"fixed": 6, "min": 4, "max": 12},
                        },
                    },
                }
            ],
            "tooltip": {"mode": "details"},
        }


@dataclass
class Row:
    """A titled band of panels (laid out left to right, wrapping at the grid width)."""

    title: str
    panels: Sequence[Panel]
    collapsed: bool = False


@dataclass(frozen=True)
class Variable:
    """A query variable: ``query`` is InfluxQL ``SHOW TAG VALUES ... WITH KEY = "..."``
    (which may refer to earlier variables: chained variables)."""

    name: str
    query: str
    label: str | None = None
    multi: bool = False
    include_all: bool = False
    refresh: Literal["load", "time"] = "time"
    regex: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label or self.name,
            "type": "query",
            "datasource": _ds(),
            "query": self.query,
            "definition": self.query,
            "regex": self.regex,
            "refresh": 1 if self.refresh == "load" else 2,
            "sort": 1,
            "multi": self.multi,
            "includeAll": self.include_all,
            "hide": 0,
            "options": [],
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if self.include_all else {},
        }


@dataclass(frozen=True)
class Annotation:
    """Event markers from an InfluxQL query (``text_column``/``tags_column`` name its columns).

    Written in the InfluxQL datasource's annotation format (``query`` + column names), which
    Grafana migrates into its current query model when it loads the dashboard.
    """

    name: str
    query: str
    color: str = RED
    text_column: str = ""
    tags_column: str = ""
    title_column: str = ""
    enabled: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "datasource": _ds(),
            "enable": self.enabled,
            "hide": False,
            "iconColor": self.color,
            "query": self.query,
            "textColumn": self.text_column,
            "tagsColumn": self.tags_column,
            "titleColumn": self.title_column,
        }


def _builtin_annotation() -> dict[str, Any]:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


@dataclass
class Dashboard:
    uid: str
    title: str
    rows: Sequence[Row]
    description: str = ""
    tags: Sequence[str] = ("iotwatch",)
    variables: Sequence[Variable] = ()
    annotations: Sequence[Annotation] = ()
    refresh: str = "30s"
    time_from: str = "now-6h"
    folder: str = FOLDER

    def panels(self) -> Iterable[Panel]:
        for row in self.rows:
            yield from row.panels

    def to_dict(self) -> dict[str, Any]:
        if len(self.uid) > 40:
            raise ValueError(f"dashboard uid {self.uid!r} is longer than Grafana's 40 characters")
        panels: list[dict[str, Any]] = []
        next_id, y = 1, 0
        for row in self.rows:
            header: dict[str, Any] = {
                "id": next_id,
                "type": "row",
                "title": row.title,
                "collapsed": row.collapsed,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
            next_id, y = next_id + 1, y + 1
            row_panels: list[dict[str, Any]] = []
            x, line_height = 0, 0
            for panel in row.panels:
                width = min(panel.width, GRID_WIDTH)
                if x + width > GRID_WIDTH:  # wrap to the next line of this row
                    x, y, line_height = 0, y + line_height, 0
                row_panels.append(panel.to_dict(next_id, {"h": panel.height, "w": width, "x": x, "y": y}))
                next_id, x, line_height = next_id + 1, x + width, max(line_height, panel.height)
            y += line_height
            if row.collapsed:  # a collapsed row carries its panels inside it and takes one line
                header["panels"] = row_panels
                panels.append(header)
                y = header["gridPos"]["y"] + 1
            else:
                panels.extend([header, *row_panels])
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,  # shared crosshair
            "refresh": self.refresh,
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "links": [
                {
                    "type": "dashboards",
                    "tags": ["iotwatch"],
                    "asDropdown": True,
                    "title": "iotwatch",
                    "includeVars": False,
                    "keepTime": True,
                    "icon": "external link",
                    "targetBlank": False,
                    "tooltip": "",
                    "url": "",
                }
            ],
            "annotations": {"list": [_builtin_annotation(), *(a.to_dict() for a in self.annotations)]},
            "templating": {"list": [v.to_dict() for v in self.variables]},
            "panels": panels,
        }
