"""Request bodies of the exports/imports endpoints (dstack's names and defaults)."""

from __future__ import annotations

from corral.schemas.requests import Body


class CreateExportBody(Body):
    name: str
    is_global: bool = False
    importer_projects: list[str] = []
    exported_fleets: list[str] = []
    exported_gateways: list[str] = []


class UpdateExportBody(Body):
    name: str
    set_global: bool = False
    unset_global: bool = False
    add_importer_projects: list[str] = []
    remove_importer_projects: list[str] = []
    add_exported_fleets: list[str] = []
    remove_exported_fleets: list[str] = []
    add_exported_gateways: list[str] = []
    remove_exported_gateways: list[str] = []


class ExportNameBody(Body):
    name: str


class DeleteImportBody(Body):
    export_name: str
    export_project_name: str
