"""A job's text as an uploaded file: `multipart/form-data` (the file in the `file` field,
the JSON body's other fields as form fields) or the file itself as the body (options in
the query string). Either way the body is read in bounded pieces: past
`jobs.max_request_bytes`, or past the most bytes a text of `jobs.max_text_chars`
characters can take in UTF-8 (4 a character), the answer is 413 before the rest is read.
The multipart parser (python-multipart, through Starlette) keeps a large file part on
disk, not in memory, until it is known to fit.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from app.errors import InvalidRequest, RequestTooLarge
from app.jobs.config import JobsConfig
from app.jobs.schema import JobRequest, parse_job_upload
from app.routes import capped_body

# room for a multipart body's boundaries, part headers and form fields beside the file
_FORM_OVERHEAD_BYTES = 64 * 1024
_UTF8_MAX_BYTES_PER_CHAR = 4
# the JSON body's fields besides `input`, each at most this long as a form field
_MAX_FIELDS = 16
_MAX_FIELD_BYTES = 4096


def upload_limit_bytes(config: JobsConfig) -> int:
    """The largest upload body read: the request limit, or less when no text of
    `max_text_chars` characters can be that large."""
    most = config.max_text_chars * _UTF8_MAX_BYTES_PER_CHAR + _FORM_OVERHEAD_BYTES
    return min(config.max_request_bytes, most)


async def parse_multipart_job(request: Request, config: JobsConfig) -> JobRequest:
    """A multipart/form-data job: the text in `file` (a .txt or .md file, UTF-8), the
    other fields (`voice`, `response_format`, `speed`, `sample_rate`, `finish_by`,
    `title`, by default the file's name without its extension) as form fields."""
    limit = upload_limit_bytes(config)
    parser = MultiPartParser(
        request.headers,
        capped_body(request, limit),  # type: ignore[arg-type]
        max_files=1,
        max_fields=_MAX_FIELDS,
        max_part_size=_MAX_FIELD_BYTES,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise InvalidRequest(
            f"The multipart/form-data body does not parse: {exc.message}",
            param="file",
            code="invalid_form",
        ) from None
    try:
        fields: dict[str, str] = {}
        upload: UploadFile | None = None
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                if name != "file":
                    raise InvalidRequest(
                        f"The uploaded file is in the field {name!r}: send it as 'file'.",
                        param=name,
                    )
                upload = value
            elif name == "file":
                raise InvalidRequest(
                    "'file' must be an uploaded file (a filename in its part), not a form "
                    "field: send the text as JSON 'input' instead.",
                    param="file",
                )
            elif name in fields:
                raise InvalidRequest(f"The form field {name!r} is sent twice.", param=name)
            else:
                fields[name] = value
        if upload is None:
            raise InvalidRequest(
                "A multipart/form-data job needs its text as the file field 'file' "
                "(a .txt or .md file).",
                param="file",
                code="missing_file",
            )
        size = upload.size
        if size is not None and size > limit - _FORM_OVERHEAD_BYTES:
            raise RequestTooLarge(
                f"The uploaded file is {size} bytes: more than a text of "
                f"{config.max_text_chars} characters (jobs.max_text_chars) takes.",
                code="file_too_large",
            )
        body = await upload.read()
        if not fields.get("title") and upload.filename:  # book.md: "book"
            fields["title"] = PurePosixPath(upload.filename).stem
    finally:
        await form.close()
    return checked_upload(parse_job_upload(body, fields), config)


def checked_upload(job_request: JobRequest, config: JobsConfig) -> JobRequest:
    """An uploaded text over `jobs.max_text_chars` characters: 413, as a file too large."""
    if len(job_request.input) > config.max_text_chars:
        raise RequestTooLarge(
            f"The uploaded file has {len(job_request.input)} characters, at most "
            f"{config.max_text_chars} allowed (jobs.max_text_chars).",
            code="file_too_large",
        )
    return job_request
