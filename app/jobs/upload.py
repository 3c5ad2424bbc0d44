"""POST /v1/audio/jobs as a form, as `curl -F file=@book.md -F voice=...` and a browser's
form send it (multipart/form-data): the text as a .txt or .md file in the part `file` (or
as the field `input`), the other options as form fields named as in the JSON body. A form
without a file (application/x-www-form-urlencoded, `curl -d input=... -d voice=...`) gives
its text as `input`.

The body was read whole within `jobs.max_request_bytes` before it gets here (a larger one
is answered 413 unread); Starlette's parser (python-multipart) splits it. What a file holds
is checked as a text/plain upload's is (app/jobs/schema.py): UTF-8, no NUL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import PurePosixPath

from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser

from app.errors import InvalidRequest
from app.jobs.schema import JobRequest, parse_job_upload

TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown")
MAX_FIELDS = 16  # the options are fewer; more is not a job form
MAX_FIELD_BYTES = 4096  # an option's value (a title, a time); the text goes as a file


async def parse_job_form(body: bytes, content_type: str) -> JobRequest:
    """The job a multipart body asks for: InvalidRequest (400) for a form that cannot be
    read, no text or two, a file that is not .txt or .md, or what a text/plain upload
    refuses."""

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    headers = Headers({"content-type": content_type})
    if content_type.split(";")[0].strip().lower() == "multipart/form-data":
        parser: MultiPartParser | FormParser = MultiPartParser(
            headers,
            chunks(),
            max_files=1,
            max_fields=MAX_FIELDS,
            max_part_size=MAX_FIELD_BYTES,
        )
    else:
        parser = FormParser(headers, chunks())
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise InvalidRequest(
            f"We could not read the form: {exc.message}.", code="invalid_form"
        ) from None
    try:
        files = [(name, part) for name, part in form.multi_items() if isinstance(part, UploadFile)]
        fields: dict[str, str] = {}
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                continue
            if name in fields:
                raise InvalidRequest(f"The field '{name}' is given twice.", param=name)
            fields[name] = value
        if files:
            name, upload = files[0]
            if name != "file":
                raise InvalidRequest(
                    f"The file is in the part '{name}': send it as 'file'.", param="file"
                )
            if "input" in fields:
                raise InvalidRequest(
                    "Send the text as a file or as 'input', not both.", param="input"
                )
            filename = upload.filename or ""
            suffix = PurePosixPath(filename).suffix.lower()
            if filename and suffix not in TEXT_SUFFIXES:
                raise InvalidRequest(
                    f"The file {filename!r} is not a .txt or .md file.",
                    param="file",
                    code="invalid_file",
                )
            text = await upload.read()
            if not fields.get("title") and filename:
                fields["title"] = PurePosixPath(filename).stem
        elif "input" in fields:
            text = fields.pop("input").encode("utf-8")
        else:
            raise InvalidRequest(
                "The form has no text: send the file as 'file' (or the text as 'input').",
                param="file",
            )
        return parse_job_upload(text, fields)
    finally:
        await form.close()
